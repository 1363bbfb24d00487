"""Training paths side by side on CPU: tokens/s and wall time, interleaved runs, ratios.

Two comparisons, each run interleaved (ABBA, several rounds), printing median tokens/s and wall
time of each side and their ratios. Only ratios measured side by side in one run mean anything
on these machines.

- ``hf`` against ``native`` (the default): both start from the embedded tiny HF checkpoint (the
  native path loads it through torchtitan's Qwen3 state-dict adapter) and train the same smoke job.
- ``--moe-before REF``: ``model=nki_moe``'s smoke job (tiny_moe) as this tree runs it against the
  same job run by the tree at git revision REF (a temporary worktree), e.g. the commit before the
  experts were stored in the kernels' layout with ``moe_compute_dtype: auto``.

    python bench/paths.py [--rounds 3] [--steps 20] [--moe-before REF] [extra overrides ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, abba, median_tps, timed  # noqa: E402
from qwen3_trainium.data import assets as make_assets  # noqa: E402


def path_overrides(path: str, weights: str) -> list[str]:
    if path == "hf":
        return ["model=hf", f"model.hf_model={weights}"]
    return [
        "model=native",
        "checkpoint.enable=true",
        f"checkpoint.initial_load_path={weights}",
        "checkpoint.initial_load_in_hf=true",
        "checkpoint.load_only=true",
    ]


def launch_in(tree: Path, run_dir: Path, overrides: list[str]) -> float:
    """``python launch.py OVERRIDES`` of the tree ``tree`` (its own package first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return timed([sys.executable, str(tree / "launch.py"), *overrides, f"hydra.run.dir={run_dir}"], env=env)


def sides(args, work: Path) -> dict[str, tuple[Path, list[str]]]:
    """name -> (the tree that runs it, its overrides)."""
    if args.moe_before:
        before = work / "before-tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), args.moe_before], cwd=ROOT,
                       check=True, capture_output=True)  # fmt: skip
        return {"nki_moe before": (before, ["model=nki_moe"]), "nki_moe": (ROOT, ["model=nki_moe"])}
    weights = str(make_assets.ensure_hf_model())
    return {path: (ROOT, path_overrides(path, weights)) for path in ("hf", "native")}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--moe-before", metavar="REF", help="nki_moe here against nki_moe at git revision REF"
    )
    parser.add_argument("overrides", nargs="*", default=[])
    args = parser.parse_args()

    common = ["smoke=on", "tracking=off", f"training.steps={args.steps}", *args.overrides]
    work = Path(tempfile.mkdtemp(prefix="bench_paths_"))
    runs = sides(args, work)
    names = tuple(runs)
    tps: dict[str, list[float]] = {name: [] for name in names}
    walls: dict[str, list[float]] = {name: [] for name in names}
    try:
        for r, order in enumerate(abba(args.rounds, names)):
            for name in order:
                tree, overrides = runs[name]
                run_dir = work / f"{r}-{name.replace(' ', '_')}"
                walls[name].append(launch_in(tree, run_dir, [*overrides, *common]))
                tps[name].append(median_tps(run_dir))
                print(
                    f"round {r + 1}/{args.rounds}  {name:15s} tokens/s {tps[name][-1]:8.0f}  wall {walls[name][-1]:6.2f} s",
                    flush=True,
                )
    finally:
        if args.moe_before:
            subprocess.run(["git", "worktree", "remove", "--force", str(work / "before-tree")], cwd=ROOT,
                           capture_output=True)  # fmt: skip
    med = {k: statistics.median(v) for k, v in tps.items()}
    wall = {k: statistics.median(v) for k, v in walls.items()}
    first, second = names
    print(f"\njob: {' '.join(common)}   rounds: {args.rounds}   (medians)")
    for name in names:
        print(f"{name:15s} tokens/s {med[name]:8.0f}   wall {wall[name]:6.2f} s")
    print(f"tokens/s ratio  {first} / {second} = {med[first] / med[second]:.3f}")
    print(f"wall-time ratio {first} / {second} = {wall[first] / wall[second]:.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
