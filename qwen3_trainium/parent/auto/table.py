"""The plan as people read it: the ranked table the dry run prints, and ``auto_plan.md`` /
``auto_plan.json`` in the run directory."""

from __future__ import annotations

import json
import os

GiB = 2**30


def _row(r: dict, world: int) -> list[str]:
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] else "n/a"
    source = "traced" if r["peak_source"].startswith("traced") else "est."
    comm = ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in r["comm_parts"].items() if v) or "none"
    accum = f" x{r['accum']}" if r["accum"] > 1 else ""
    world_note = f" ({r['world']} ranks)" if r["world"] != world else ""
    return [
        str(r["rank"]), r["layout"] + world_note, r["ac"], f"{r['local_batch']}{accum}",
        f"{r['peak_bytes'] / GiB:.2f} GiB {source}", f"{r['step_seconds']:.3f} s",
        f"{1e3 * r['comm_seconds']:.0f} ms ({comm})", f"{r['tokens_per_second']:,.0f}", mfu, r["verdict"],
    ]  # fmt: skip


HEADER = [
    "#",
    "layout",
    "AC",
    "batch",
    "peak/rank",
    "step",
    "exposed comm (raw)",
    "tok/s/rank",
    "MFU",
    "verdict",
]


def rows_of(data: dict, top: int) -> list[list[str]]:
    return [_row(r, data["world"]) for r in data["rows"][:top]]


def text(data: dict, top: int) -> str:
    """The dry run's table: ``top`` rows, aligned, with the winner's overrides."""
    body = [HEADER] + rows_of(data, top)
    widths = [max(len(line[i]) for line in body) for i in range(len(HEADER))]
    lines = [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in body
    ]
    return "\n".join([_title(data, top)] + lines + _footer(data))


def markdown(data: dict, top: int) -> str:
    body = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    body += ["| " + " | ".join(cells) + " |" for cells in rows_of(data, top)]
    return "\n".join([f"# {_title(data, top)}", "", *body, "", *_footer(data), ""])


def _title(data: dict, top: int) -> str:
    return (
        f"parallel=auto: {data['candidates']} legal layouts of {data['world']} ranks"
        f" (seq {data['seq_len']}, global batch {data['global_batch']}), {data['traced']} traced,"
        f" planned in {data['planning_seconds']:.1f} s; the best {min(top, len(data['rows']))}:"
    )


def _footer(data: dict) -> list[str]:
    lines = []
    if data["refused"]:
        refused = ", ".join(f"{n} by {key}" for key, n in sorted(data["refused"].items()))
        lines.append(f"  refused by pre-flight's rules: {refused}")
    lines += [f"  {note}" for note in data["notes"]]
    if data["winner"] is not None:
        lines.append("  the winner, without parallel=auto: " + " ".join(data["rows"][0]["overrides"]))
    return lines


def write(data: dict, run_dir: str, top: int) -> tuple[str, str]:
    """``auto_plan.json`` (every row) and ``auto_plan.md`` (``top`` rows) in ``run_dir``."""
    os.makedirs(run_dir, exist_ok=True)
    json_path, md_path = os.path.join(run_dir, "auto_plan.json"), os.path.join(run_dir, "auto_plan.md")
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1)
    with open(md_path, "w") as f:
        f.write(markdown(data, top))
    return json_path, md_path
