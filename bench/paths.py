"""model=hf vs model=native on the same tiny weights: tokens/s side by side.

Both paths start from the embedded tiny HF checkpoint (the native path loads it through
torchtitan's Qwen3 state-dict adapter), train the same smoke job on the same data, and are run
interleaved (ABBA, several rounds). Prints median tokens/s and wall time of each and the ratios
(hf / native). Only ratios measured side by side in one run mean anything on these machines.

    python bench/paths.py [--rounds 3] [--steps 20] [extra overrides ...]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import abba, launch, median_tps  # noqa: E402
from qwen3_trainium import make_assets  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("overrides", nargs="*", default=[])
    args = parser.parse_args()

    weights = str(make_assets.ensure_hf_model())
    common = ["smoke=on", "tracking=off", f"training.steps={args.steps}", *args.overrides]
    work = Path(tempfile.mkdtemp(prefix="bench_paths_"))
    tps: dict[str, list[float]] = {"hf": [], "native": []}
    walls: dict[str, list[float]] = {"hf": [], "native": []}
    for r, order in enumerate(abba(args.rounds, ("hf", "native"))):
        for path in order:
            run_dir = work / f"{r}-{path}"
            walls[path].append(launch(run_dir, [*path_overrides(path, weights), *common]))
            tps[path].append(median_tps(run_dir))
            print(
                f"round {r + 1}/{args.rounds}  {path:7s} tokens/s {tps[path][-1]:8.0f}  wall {walls[path][-1]:6.2f} s",
                flush=True,
            )

    med = {k: statistics.median(v) for k, v in tps.items()}
    wall = {k: statistics.median(v) for k, v in walls.items()}
    print(f"\njob: {' '.join(common)}   rounds: {args.rounds}   (medians)")
    for path in ("hf", "native"):
        print(f"{path:8s} tokens/s {med[path]:8.0f}   wall {wall[path]:6.2f} s")
    print(f"tokens/s ratio  hf / native = {med['hf'] / med['native']:.3f}")
    print(f"wall-time ratio hf / native = {wall['hf'] / wall['native']:.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
