"""Helpers shared by the benchmarks: run a command, time it, read its metrics.jsonl."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def median_tps(run_dir: Path) -> float:
    from qwen3_trainium.shared.contract import read_metrics

    rows = read_metrics(str(run_dir), merge=False)
    return statistics.median(r["tokens_per_second"] for r in rows[1:])  # step 1 includes warm-up


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    return started_and_wall(argv, env)[1]


def started_and_wall(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run argv from the repository root: (time.time() just before it started, its wall seconds).
    The start is wall-clock time so that times the run itself writes (metrics.jsonl's ``time``)
    can be measured from it."""
    started = time.time()
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env or dict(os.environ), cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"run failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr[-2000:]}")
    return started, wall


def launch(run_dir: Path, overrides: list[str]) -> float:
    """``python launch.py OVERRIDES`` into run_dir; returns the wall time."""
    return timed([sys.executable, "launch.py", *overrides, f"hydra.run.dir={run_dir}"])


def abba(rounds: int, kinds: tuple[str, str]) -> list[list[str]]:
    """Interleaved order, alternating which runs first, so drift hits both alike."""
    return [list(kinds) if r % 2 == 0 else list(reversed(kinds)) for r in range(rounds)]
