"""What does ``python launch.py`` cost over bare torchrun? Three figures, each side by side.

1. The smoke job (``make smoke``: model=native smoke=on), run interleaved (rotating order,
   several rounds) three ways:
   - launch.py: Hydra, pre-flight, torchrun, the loss plot; pre-flight remembered from an
     earlier run of the same config (the usual case: the same job again);
   - launch.py, first run: ``preflight_cache=false``, every check runs, the torchtitan-level
     ones while the ranks import torch;
   - bare torchrun: the same resolved job started with its own torchrun line (no Hydra, no
     pre-flight).
   Prints median wall times and the ratios to bare torchrun.
2. The dry run (``dry_run=true``): median wall, remembered and first run.
3. A sweep (``-m model=hf,native,nki_moe smoke=on``) against the sum of its jobs run bare.
Only ratios measured side by side in one run mean anything on these noisy machines.

    python bench/launch_overhead.py [--rounds 4] [--dry-runs 5] [--sweep-rounds 2] [--no-sweep]
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

from bench.common import launch, timed  # noqa: E402
from qwen3_trainium.config import runconfig  # noqa: E402
from qwen3_trainium.parent.launcher import rank_env, torchrun_argv  # noqa: E402

SMOKE = ["model=native", "smoke=on"]  # make smoke
SWEEP = ["model=hf,native,nki_moe", "smoke=on"]
WARM, FIRST, BARE = "launch.py", "launch.py, first run", "bare torchrun"


def run_bare(run_dir: Path, resolved: Path) -> float:
    run_dir.mkdir(parents=True)
    shutil.copy(resolved, run_dir / runconfig.RESOLVED_NAME)
    run = runconfig.load(str(resolved))
    # The same variables launch.py would pass (run dir, threads, W&B), set by hand.
    env = {**os.environ, **rank_env(run, str(run_dir), dict(os.environ))}
    return timed(torchrun_argv(run, str(run_dir)), env)


def rotations(rounds: int, kinds: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Each round starts with the next kind, so drift hits every kind alike."""
    return [kinds[r % len(kinds) :] + kinds[: r % len(kinds)] for r in range(rounds)]


def smoke(work: Path, rounds: int) -> dict[str, float]:
    resolved = work / "first" / runconfig.RESOLVED_NAME
    launch(work / "first", SMOKE)  # remembers pre-flight; its resolved.yaml feeds the bare runs
    walls: dict[str, list[float]] = {WARM: [], FIRST: [], BARE: []}
    for r, order in enumerate(rotations(rounds, (WARM, FIRST, BARE))):
        for kind in order:
            run_dir = work / f"smoke-{r}-{len(walls[kind])}-{kind.replace(' ', '_').replace(',', '')}"
            if kind == BARE:
                wall = run_bare(run_dir, resolved)
            else:
                wall = launch(run_dir, SMOKE + (["preflight_cache=false"] if kind == FIRST else []))
            walls[kind].append(wall)
            print(f"smoke round {r + 1}/{rounds}  {kind:22s} wall {wall:6.2f} s", flush=True)
    return {kind: values for kind, values in walls.items()}


def dry_runs(work: Path, count: int) -> dict[str, float]:
    walls: dict[str, list[float]] = {WARM: [], FIRST: []}
    for i in range(count):
        for kind in (WARM, FIRST):
            extra = ["preflight_cache=false"] if kind == FIRST else []
            walls[kind].append(launch(work / f"dry-{i}-{len(extra)}", [*SMOKE, "dry_run=true", *extra]))
        print(
            f"dry run {i + 1}/{count}  remembered {walls[WARM][-1]:5.2f} s  first run {walls[FIRST][-1]:5.2f} s",
            flush=True,
        )
    return {kind: statistics.median(values) for kind, values in walls.items()}


def sweep(work: Path, rounds: int) -> tuple[float, float]:
    def run_sweep(sweep_dir: Path) -> float:
        return timed([sys.executable, "launch.py", "-m", *SWEEP, f"hydra.sweep.dir={sweep_dir}"])

    run_sweep(work / "sweep-first")  # remembers pre-flight; its jobs' resolved.yaml feed the bare runs
    jobs = sorted((work / "sweep-first").glob("[0-9]*/" + runconfig.RESOLVED_NAME))
    if len(jobs) != 3:
        sys.exit(f"the sweep wrote {len(jobs)} resolved configs, not 3, under {work / 'sweep-first'}")
    swept, bare = [], []
    for r in range(rounds):
        for kind in ("sweep", "bare") if r % 2 == 0 else ("bare", "sweep"):
            if kind == "sweep":
                swept.append(run_sweep(work / f"sweep-{r}"))
            else:
                bare.append(sum(run_bare(work / f"bare-{r}-{i}", job) for i, job in enumerate(jobs)))
        print(
            f"sweep round {r + 1}/{rounds}  sweep {swept[-1]:6.2f} s  sum of bare jobs {bare[-1]:6.2f} s",
            flush=True,
        )
    return statistics.median(swept), statistics.median(bare)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--dry-runs", type=int, default=5)
    parser.add_argument("--sweep-rounds", type=int, default=2)
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="launch_overhead_"))
    os.environ["XDG_CACHE_HOME"] = str(work / "xdg-cache")  # a pre-flight cache of this bench's own
    walls = smoke(work, args.rounds)
    dry = dry_runs(work, args.dry_runs)
    swept = None if args.no_sweep else sweep(work, args.sweep_rounds)

    print(f"\n{args.rounds} rounds of {' '.join(SMOKE)}, {os.cpu_count()} CPUs; noise only adds time, so the")
    print("best of the rounds is shown beside the median")
    print("| figure | wall s (median) | ratio to bare | wall s (best) | ratio to bare |")
    print("|---|---:|---:|---:|---:|")
    med = {kind: statistics.median(values) for kind, values in walls.items()}
    best = {kind: min(values) for kind, values in walls.items()}
    for kind in (WARM, FIRST, BARE):
        print(
            f"| smoke, {kind} | {med[kind]:.2f} | {med[kind] / med[BARE]:.3f} "
            f"| {best[kind]:.2f} | {best[kind] / best[BARE]:.3f} |"
        )
    for kind in (WARM, FIRST):
        print(f"| dry run, {'remembered' if kind == WARM else 'first run'} | {dry[kind]:.2f} | | | |")
    if swept:
        print(f"| sweep {' '.join(SWEEP)} | {swept[0]:.2f} | {swept[0] / swept[1]:.3f} | | |")
        print(f"| sum of its 3 jobs, bare torchrun | {swept[1]:.2f} | 1.000 | | |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
