"""What a run leaves for people: ``job.json`` (how the job went), its summary row, loss plots
(and a MoE run's expert-load heatmap, ``expert_plot.py``), and a sweep's ``summary.csv`` /
``summary.md`` / ``loss.png``.

Everything is read back from run directories (``job.json``, ``metrics.jsonl``), so a summary
can be made for jobs that ran in other processes or on other machines (Slurm).
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import threading
from pathlib import Path
from typing import Any

from qwen3_trainium.parent import expert_plot
from qwen3_trainium.shared import expert_load_file
from qwen3_trainium.shared.contract import JOB_NAME, METRICS_NAME, read_json, read_metrics

PLOT_NAME = "loss.png"
COLUMNS = (
    "job",
    "overrides",
    "status",
    "steps",
    "first_loss",
    "final_loss",
    "final_val_loss",
    "objective",
    "median_tokens_per_s",
    "peak_memory_gib",
    "wall_s",
)


def update_job(run_dir: str, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into ``<run_dir>/job.json`` (written whole, then renamed into place)."""
    path = os.path.join(run_dir, JOB_NAME)
    record = read_json(path) | fields
    os.makedirs(run_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)
    return record


def final_loss(run_dir: str, key: str = "loss") -> float:
    """The last logged ``key`` (``loss``, ``val_loss``); NaN when the run logged none."""
    values = _number(read_metrics(run_dir), key)
    return values[-1] if values else math.nan


def objective_key(eval_enabled: bool, dpo: bool = False) -> str:
    """What a job returns to sweepers (Optuna's objective): held-out loss when eval is on. With
    objective=dpo and eval on, the held-out preference accuracy (TRL's eval_rewards/accuracies, to
    maximise: conf/hydra/sweeper/dpo_beta_search.yaml): the DPO loss scales with beta (at beta -> 0
    it is ln 2 whatever the model prefers), so losses of runs with other betas do not compare."""
    if dpo and eval_enabled:
        return "val_rewards_accuracies"
    return "val_loss" if eval_enabled else "loss"


def final_metrics(run_dir: str) -> dict[str, float | None]:
    """The end of a run for ``job.json``: last training loss, held-out loss and perplexity, and
    the passkey check's mean accuracy (eval.long_context; None without it)."""
    rows = read_metrics(run_dir)
    out: dict[str, float | None] = {}
    for key in ("loss", "val_loss", "val_perplexity", "val_rewards_accuracies", "passkey_accuracy"):
        values = _number(rows, key)
        out[f"final_{key}"] = values[-1] if values else None
    return out


def _number(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]


def run_row(run_dir: str, job: int | str = "") -> dict[str, Any]:
    """One summary row: overrides, status, steps done of total, first/final loss, median tokens/s,
    peak memory of the fullest rank, wall time; a MoE run's expert load (``expert_plot.MOE_COLUMNS``)."""
    record = read_json(os.path.join(run_dir, JOB_NAME))
    rows = read_metrics(run_dir)
    losses = _number(rows, "loss")
    val_losses = _number(rows, "val_loss")
    accuracies = _number(rows, "val_rewards_accuracies")  # objective=dpo, eval=on
    tps = _number(rows, "tokens_per_second")
    memory = _number(rows, "memory_max_all_ranks_gib") or _number(rows, "memory_max_active_gib")
    done = rows[-1]["step"] if rows else 0
    return {
        "job": job,
        "overrides": " ".join(record.get("overrides", [])),
        "status": record.get("status", "unknown"),
        "steps": f"{done}/{record.get('total_steps', '?')}",
        "first_loss": round(losses[0], 4) if losses else "",
        "final_loss": round(losses[-1], 4) if losses else "",
        "final_val_loss": round(val_losses[-1], 4) if val_losses else "",
        "objective": record.get("objective", "loss"),
        "final_val_accuracy": round(accuracies[-1], 4) if accuracies else "",
        "median_tokens_per_s": round(statistics.median(tps)) if tps else "",
        "peak_memory_gib": round(max(memory), 3) if memory else "",
        "wall_s": round(record["wall_s"], 1) if isinstance(record.get("wall_s"), (int, float)) else "",
        "run_dir": run_dir,
    } | expert_load_file.summary(expert_load_file.read_load(run_dir))


def columns(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """The summary's columns: the expert-load ones only when a job is a MoE run with a record;
    the held-out preference accuracy only when a job is an objective=dpo run with eval=on."""
    dpo = any(row.get("final_val_accuracy", "") != "" for row in rows)
    moe = any(row.get("max_load", "") != "" for row in rows)
    base = COLUMNS + ("final_val_accuracy",) if dpo else COLUMNS
    return base + expert_plot.MOE_COLUMNS if moe else base


def markdown_table(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|") or "-"

    names = columns(rows)
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(cell(row[c]) for c in names) + " |" for row in rows]
    return "\n".join(lines)


class RunPlotter:
    """``loss.png`` of one run, drawn as soon as the last step is in ``metrics.jsonl``: while
    torchtitan and torchrun shut down (two seconds and more of idle CPU), not after them, and
    not while the ranks start or train (importing matplotlib takes about a CPU second).
    ``finish`` redraws only if the metrics changed since (a failed or shorter run, a resume)."""

    POLL_S = 0.2

    def __init__(self, run_dir: str, label: str, total_steps: int) -> None:
        self.run_dir, self.label, self.total_steps = run_dir, label, total_steps
        self._drawn_from: tuple | None = None
        self._seen: tuple | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loss-plot", daemon=True)
        self._thread.start()

    def _stamp(self) -> tuple | None:
        try:
            st = os.stat(os.path.join(self.run_dir, METRICS_NAME))
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def _watch(self) -> None:
        while not self._stop.wait(self.POLL_S):
            stamp = self._stamp()
            if stamp is None or stamp == self._seen:
                continue
            self._seen = stamp
            if self._last_step() >= self.total_steps:
                plot_run(self.run_dir, self.label)
                self._drawn_from = stamp
                return

    def _last_step(self) -> int:
        """The step of the file's last complete row (only its tail is read: a long run's file is big)."""
        path = os.path.join(self.run_dir, METRICS_NAME)
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 8192))
                lines = f.read().splitlines()
        except OSError:
            return 0
        for line in reversed(lines):
            try:
                return int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
        return 0

    def finish(self) -> bool:
        self._stop.set()
        self._thread.join()
        if self._drawn_from is not None and self._drawn_from == self._stamp():
            return True
        return plot_run(self.run_dir, self.label)


def plot_losses(series: dict[str, list[dict[str, Any]]], path: str, title: str) -> bool:
    """Loss against step, one line per label, into a PNG (headless); held-out loss (eval=on) as a
    dashed line of the same colour. False when nothing to plot."""
    curves = {label: _points(rows, "loss") for label, rows in series.items()}
    held_out = {label: _points(rows, "val_loss") for label, rows in series.items()}
    if not any(curves.values()) and not any(held_out.values()):
        return False
    plt = expert_plot.pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for label in series:
        color = None
        if curves[label]:
            steps, losses = zip(*curves[label], strict=True)
            (line,) = ax.plot(steps, losses, marker="." if len(steps) < 50 else None, label=label)
            color = line.get_color()
        if held_out[label]:
            steps, losses = zip(*held_out[label], strict=True)
            ax.plot(steps, losses, linestyle="--", marker="o", color=color, label=f"{label} (val_loss)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    partial = f"{path}.{os.getpid()}.partial.png"
    fig.savefig(partial)
    plt.close(fig)
    os.replace(partial, path)  # whoever sees loss.png sees all of it
    return True


def _points(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(r["step"], float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]


def plot_run(run_dir: str, label: str) -> bool:
    """``loss.png``, and ``expert_load.png`` for a MoE run; whether the loss plot was drawn."""
    drawn = plot_losses({label: read_metrics(run_dir)}, os.path.join(run_dir, PLOT_NAME), label)
    expert_plot.plot_expert_load(run_dir, label)
    return drawn


def write_summary(sweep_dir: str, rows: list[dict[str, Any]], labels: list[str]) -> str:
    """``summary.csv``, ``summary.md`` (with MoE jobs' expert-load heatmaps) and ``loss.png`` in
    the sweep directory; returns the table."""
    with open(os.path.join(sweep_dir, "summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*columns(rows), "run_dir"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    table = markdown_table(rows)
    heatmaps = expert_plot.sweep_section(sweep_dir, rows, labels)
    with open(os.path.join(sweep_dir, "summary.md"), "w") as f:
        f.write(f"# Sweep {sweep_dir}\n\n{table}\n{heatmaps}")
    series = {label: read_metrics(row["run_dir"]) for label, row in zip(labels, rows, strict=True)}
    plot_losses(series, os.path.join(sweep_dir, PLOT_NAME), "sweep " + "/".join(Path(sweep_dir).parts[-2:]))
    return table
