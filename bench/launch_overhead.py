"""What does ``python launch.py`` cost over a bare torchrun of the same job?

The same smoke job, run interleaved (ABBA order, several rounds) by
  A: python launch.py <overrides>                      (Hydra compose, pre-flight, torchrun)
  B: torchrun ... -m qwen3_trainium.train --module qwen3_trainium.titan --config trainer_config
     on a copy of A's resolved.yaml                     (no Hydra, no pre-flight)
Prints the median wall time and median tokens/s of each and their ratios (A / B). These
machines are noisy, so only ratios measured side by side in one run mean anything.

    python bench/launch_overhead.py [--rounds 3] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen3_trainium import runconfig  # noqa: E402
from qwen3_trainium.launcher import rank_env, torchrun_argv  # noqa: E402

DEFAULT_OVERRIDES = ["model=native", "smoke=on", "tracking=off"]


def median_tps(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tokens_per_second"] for r in rows[1:])  # step 1 includes warm-up


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"run failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr[-2000:]}")
    return wall


def run_launch(run_dir: Path, overrides: list[str]) -> float:
    argv = [sys.executable, "launch.py", *overrides, f"hydra.run.dir={run_dir}"]
    return timed(argv, dict(os.environ))


def run_bare(run_dir: Path, resolved: Path) -> float:
    run_dir.mkdir(parents=True)
    shutil.copy(resolved, run_dir / runconfig.RESOLVED_NAME)
    run = runconfig.load(str(resolved))
    # The same variables launch.py would pass (run dir, threads, W&B), set by hand.
    env = {**os.environ, **rank_env(run, str(run_dir), dict(os.environ))}
    return timed(torchrun_argv(run, str(run_dir)), env)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("overrides", nargs="*", default=DEFAULT_OVERRIDES)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="launch_overhead_"))
    walls: dict[str, list[float]] = {"launch.py": [], "bare torchrun": []}
    tps: dict[str, list[float]] = {"launch.py": [], "bare torchrun": []}
    resolved = None
    for r in range(args.rounds):
        order = ["launch.py", "bare torchrun"] if r % 2 == 0 else ["bare torchrun", "launch.py"]
        if resolved is None:
            order = ["launch.py", "bare torchrun"]  # the bare run needs A's resolved.yaml
        for kind in order:
            run_dir = work / f"{r}-{kind.replace(' ', '_').replace('.', '_')}"
            if kind == "launch.py":
                wall = run_launch(run_dir, args.overrides)
                resolved = resolved or run_dir / runconfig.RESOLVED_NAME
            else:
                wall = run_bare(run_dir, resolved)
            walls[kind].append(wall)
            tps[kind].append(median_tps(run_dir))
            print(
                f"round {r + 1}/{args.rounds}  {kind:14s} wall {wall:6.2f} s  tokens/s {tps[kind][-1]:8.0f}",
                flush=True,
            )

    a, b = "launch.py", "bare torchrun"
    wall_a, wall_b = statistics.median(walls[a]), statistics.median(walls[b])
    tps_a, tps_b = statistics.median(tps[a]), statistics.median(tps[b])
    print(f"\njob: {' '.join(args.overrides)}   rounds: {args.rounds}   (medians)")
    print(f"{'':16s}{'wall s':>10s}{'tokens/s':>12s}")
    print(f"{a:16s}{wall_a:10.2f}{tps_a:12.0f}")
    print(f"{b:16s}{wall_b:10.2f}{tps_b:12.0f}")
    print(f"wall-time ratio  launch.py / bare torchrun = {wall_a / wall_b:.3f}  (+{wall_a - wall_b:.2f} s)")
    print(f"tokens/s ratio   launch.py / bare torchrun = {tps_a / tps_b:.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
