"""The figures of ``bench/moe.py``: one run's summary from its metrics.jsonl rows, the medians of
each route, the ratios grouped_mm / nki_moe, and the report written as Markdown.

Pure functions of rows and numbers (no processes, no files), so the math is tested on hand-made
rows (tests/test_bench_moe.py).
"""

from __future__ import annotations

import statistics
from typing import Any

ROUTES = ("grouped_mm", "nki_moe")
METRICS = ("tokens_per_second", "mfu_pct", "ttfi_s", "step_time_s", "peak_gib")
LABELS = {
    "tokens_per_second": "tokens/s",
    "mfu_pct": "MFU %",
    "ttfi_s": "TTFI s",
    "step_time_s": "step s",
    "peak_gib": "peak GiB",
}
# Which memory figure is "peak memory", best first: the HBM watch's peak (issue 38 item 4), the
# Neuron driver's per-core peak (sysfs), torch.accelerator's peak, torchtitan's max reserved
# (the only one on CPU). The first one every run has is the headline; all are kept per run.
PEAK_PREFERENCE = (
    "watched_peak_gib",
    "neuron_driver_peak_gib",
    "accelerator_peak_reserved_gib",
    "memory_max_reserved_gib",
)


def peak_keys(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Every peak-like memory figure of a run (a ``*_gib`` key naming a max or a peak, numeric),
    its largest value over the rows; capacity and current totals are not peaks."""
    peaks: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            peak_like = key.endswith("_gib") and ("max" in key or "peak" in key)
            if peak_like and isinstance(value, (int, float)) and not isinstance(value, bool):
                peaks[key] = max(peaks.get(key, value), value)
    return peaks


def summarize(rows: list[dict[str, Any]], *, warmup: int, started: float) -> dict[str, Any]:
    """One run: medians over the steps after the first ``warmup`` rows (compile and allocation
    land there), TTFI = the first row's wall-clock time minus ``started`` (the bench's time.time()
    just before it started launch.py), and the run's memory peaks."""
    if len(rows) <= warmup:
        raise ValueError(f"{len(rows)} metrics rows, none after the {warmup} warm-up step(s)")
    steady = rows[warmup:]
    mfu = [r["mfu_pct"] for r in steady if isinstance(r.get("mfu_pct"), (int, float))]
    return {
        "tokens_per_second": statistics.median(r["tokens_per_second"] for r in steady),
        "mfu_pct": statistics.median(mfu) if mfu else None,
        "step_time_s": statistics.median(r["step_time_s"] for r in steady),
        "ttfi_s": rows[0]["time"] - started,
        "first_step": rows[0]["step"],
        "peaks_gib": peak_keys(rows),
    }


def headline_memory_key(runs: list[dict[str, Any]]) -> str | None:
    """The first of PEAK_PREFERENCE that every run reports, else the first key all share."""
    common = set.intersection(*(set(run["peaks_gib"]) for run in runs)) if runs else set()
    for key in PEAK_PREFERENCE:
        if key in common:
            return key
    return min(common) if common else None


def medians(runs: list[dict[str, Any]], memory_key: str | None) -> dict[str, dict[str, float | None]]:
    """route -> metric -> the median over that route's runs (None where a run lacks the figure)."""
    out: dict[str, dict[str, float | None]] = {}
    for route in ROUTES:
        mine = [run for run in runs if run["route"] == route]
        values = {
            "tokens_per_second": [r["tokens_per_second"] for r in mine],
            "mfu_pct": [r["mfu_pct"] for r in mine],
            "ttfi_s": [r["ttfi_s"] for r in mine],
            "step_time_s": [r["step_time_s"] for r in mine],
            "peak_gib": [r["peaks_gib"].get(memory_key) if memory_key else None for r in mine],
        }
        out[route] = {
            name: statistics.median(v) if v and None not in v else None for name, v in values.items()
        }
    return out


def ratios(med: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """grouped_mm / nki_moe for each metric; None where either side is missing or zero."""
    first, second = ROUTES
    out: dict[str, float | None] = {}
    for name in METRICS:
        a, b = med[first][name], med[second][name]
        out[name] = a / b if a is not None and b else None
    return out


def _fmt(value: float | None) -> str:
    """Whole numbers from 100 up (tokens/s), three significant digits below (ratios, GiB, s)."""
    if value is None:
        return "n/a"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def medians_table(med: dict[str, dict[str, float | None]], ratio: dict[str, float | None]) -> str:
    """The medians of both routes and their ratio, as a Markdown table (also what is printed)."""
    lines = ["| figure | grouped_mm | nki_moe | grouped_mm / nki_moe |", "|---|---:|---:|---:|"]
    for name in METRICS:
        cells = (_fmt(med["grouped_mm"][name]), _fmt(med["nki_moe"][name]), _fmt(ratio[name]))
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def runs_table(runs: list[dict[str, Any]], memory_key: str | None) -> str:
    lines = [
        "| round | route | tokens/s | MFU % | TTFI s (to step) | step s | peak GiB | wall s | compile cache |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        peak = r["peaks_gib"].get(memory_key) if memory_key else None
        lines.append(
            f"| {r['round']} | {r['route']} | {r['tokens_per_second']:.1f} | {_fmt(r['mfu_pct'])} "
            f"| {r['ttfi_s']:.2f} ({r['first_step']}) | {r['step_time_s']:.3f} | {_fmt(peak)} "
            f"| {r['wall_s']:.1f} | {r['compile_cache']} |"
        )
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    """bench_moe.md: what ran, where, with which versions, per run and the medians."""
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    jobs = "\n".join(f"- {route}: `{' '.join(report['jobs'][route])}`" for route in ROUTES)
    return "\n".join(
        [
            f"# MoE routes: grouped_mm against nki_moe ({report['device']})",
            "",
            f"Measured {report['date']}, commit {report['git_commit']}, host {report['host']}.",
            f"Versions: {versions}.",
            "",
            "Jobs (`python launch.py ...`, both routes the same job but the model path):",
            jobs,
            "",
            f"{report['rounds']} round(s), ABBA order, {report['steps']} steps per run; tokens/s, MFU and"
            f" step time are medians over the steps after the first {report['warmup']} (warm-up).",
            f"- MFU: {report['mfu_peak']}",
            f"- TTFI: {report['ttfi']}",
            f"- Peak memory: `{report['memory_key']}` (max over the run's steps); every run's peaks are in bench_moe.json.",
            "",
            "## Medians",
            "",
            medians_table(report["medians"], report["ratios"]),
            "",
            "## Runs",
            "",
            runs_table(report["runs"], report["memory_key"]),
            "",
        ]
    )
