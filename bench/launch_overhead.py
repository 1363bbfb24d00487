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
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import abba, launch, median_tps, timed  # noqa: E402
from qwen3_trainium import runconfig  # noqa: E402
from qwen3_trainium.launcher import rank_env, torchrun_argv  # noqa: E402

DEFAULT_OVERRIDES = ["model=native", "smoke=on", "tracking=off"]
A, B = "launch.py", "bare torchrun"


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
    walls: dict[str, list[float]] = {A: [], B: []}
    tps: dict[str, list[float]] = {A: [], B: []}
    resolved = work / "first" / runconfig.RESOLVED_NAME
    launch(work / "first", args.overrides)  # warm caches; its resolved.yaml feeds the bare runs
    for r, order in enumerate(abba(args.rounds, (A, B))):
        for kind in order:
            run_dir = work / f"{r}-{'launch' if kind == A else 'bare'}"
            wall = launch(run_dir, args.overrides) if kind == A else run_bare(run_dir, resolved)
            walls[kind].append(wall)
            tps[kind].append(median_tps(run_dir))
            print(
                f"round {r + 1}/{args.rounds}  {kind:14s} wall {wall:6.2f} s  tokens/s {tps[kind][-1]:8.0f}",
                flush=True,
            )

    wall_a, wall_b = statistics.median(walls[A]), statistics.median(walls[B])
    tps_a, tps_b = statistics.median(tps[A]), statistics.median(tps[B])
    print(f"\njob: {' '.join(args.overrides)}   rounds: {args.rounds}   (medians)")
    print(f"{'':16s}{'wall s':>10s}{'tokens/s':>12s}")
    print(f"{A:16s}{wall_a:10.2f}{tps_a:12.0f}")
    print(f"{B:16s}{wall_b:10.2f}{tps_b:12.0f}")
    print(f"wall-time ratio  launch.py / bare torchrun = {wall_a / wall_b:.3f}  (+{wall_a - wall_b:.2f} s)")
    print(f"tokens/s ratio   launch.py / bare torchrun = {tps_a / tps_b:.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
