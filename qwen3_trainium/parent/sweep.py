"""The end of a multirun (``python launch.py -m ...``): one summary of all its jobs, and the
sweep's exit status.

``SweepSummary`` is a Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``), so it runs
once in the process that ran the sweep, whichever sweeper (basic, Optuna) or launcher (local,
Slurm) ran the jobs: it reads every job's ``job.json`` and ``metrics.jsonl`` from the sweep
directory. A failed job never stops the sweep; after all jobs ran, ``launch.py`` exits with
``exit_status()``: 1 if any job failed.
"""

from __future__ import annotations

import glob
import os
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from qwen3_trainium.parent import report

_failed_jobs: list[str] = []
OK_STATUSES = ("ok", "dry_run")


def job_dirs(sweep_dir: str) -> list[str]:
    """The sweep's job directories (those holding ``job.json``), in job order."""
    found = glob.glob(os.path.join(sweep_dir, "*", report.JOB_NAME)) + glob.glob(
        os.path.join(sweep_dir, "*", "*", report.JOB_NAME)
    )

    def order(path: str) -> tuple[int, str]:
        num = report.read_json(path).get("job_num")
        return (num if isinstance(num, int) else 1 << 30, path)

    return [os.path.dirname(path) for path in sorted(found, key=order)]


def summarize(sweep_dir: str) -> tuple[list[dict[str, Any]], str]:
    """Rows and the printed table; writes summary.csv, summary.md (MoE jobs: with their expert-load
    heatmaps and columns) and loss.png."""
    rows, labels = [], []
    for run_dir in job_dirs(sweep_dir):
        record = report.read_json(os.path.join(run_dir, report.JOB_NAME))
        rows.append(report.run_row(run_dir, job=record.get("job_num", "")))
        labels.append(f"{record.get('job_num', '?')}: {' '.join(record.get('overrides', []))}")
    if not rows:
        return rows, "(no job of this sweep left a job.json)"
    return rows, report.write_summary(sweep_dir, rows, labels)


def exit_status() -> int:
    """1 if a job of the last multirun in this process failed, else 0."""
    return 1 if _failed_jobs else 0


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = os.path.abspath(str(config.hydra.sweep.dir))
        rows, table = summarize(sweep_dir)
        failed = [str(row["job"]) for row in rows if row["status"] not in OK_STATUSES]
        _failed_jobs[:] = failed
        print(f"\n[qwen3-trainium] sweep summary ({sweep_dir})\n{table}", flush=True)
        if rows:
            names = ", ".join(f"summary.{ext}" for ext in ("csv", "md")) + ", loss.png"
            if any(row.get("max_load", "") != "" for row in rows):  # MoE jobs: heatmaps in summary.md
                names += ", expert_load.png of each MoE job"
            print(f"[qwen3-trainium] written: {names}", flush=True)
        if failed:
            print(
                f"[qwen3-trainium] {len(failed)} of {len(rows)} jobs failed: {', '.join(failed)}",
                file=sys.stderr,
            )
