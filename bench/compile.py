"""torch.compile against eager, the same job side by side: is compile=on worth it here?

For each case (flavor x seq_len) the job is run with compile=off and compile=on, interleaved
(ABBA over rounds), through ``python launch.py``. Each compiled run gets a fresh, empty Inductor
cache (TORCHINDUCTOR_CACHE_DIR), so its compile time is what a first run pays. Prints per case:
- tokens/s, the median over the steps after the warm-up ones, eager and compiled, and the ratio;
- compile s: the extra seconds of the warm-up steps (compiled minus eager), which is where
  Dynamo traces and Inductor compiles;
- the steps a run needs before compiling has paid for itself (break-even);
- peak memory (torchtitan's max reserved), eager and compiled.
Only ratios measured side by side in one run mean anything on these noisy machines.

    python bench/compile.py [--rounds 2] [--steps 8] [--device cpu|cuda|neuron] [--cases tiny:256,...]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, abba  # noqa: E402

WARMUP = 2  # steps that trace and compile (step 2 compiles the backward's recompile, if any)
DEFAULT_CASES = "tiny:256,tiny:512,debugmodel:256,debugmodel:512"


def run_case(run_dir: Path, flavor: str, seq_len: int, mode: str, args) -> list[dict]:
    env = dict(os.environ)
    if mode == "on":
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_", dir=run_dir.parent)
    argv = [
        sys.executable, "launch.py", "model=native", f"model.flavor={flavor}", f"training.seq_len={seq_len}",
        "training.local_batch_size=1", f"training.steps={args.steps}", f"compile={mode}", "tracking=off",
        f"device={args.device}", "preflight_cache=true", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"run failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(rows: list[dict]) -> dict[str, float]:
    steady = [r["tokens_per_second"] for r in rows[WARMUP:]]
    return {
        "tps": statistics.median(steady),
        "warmup_s": sum(r["step_time_s"] for r in rows[:WARMUP]),
        "step_s": statistics.median(r["step_time_s"] for r in rows[WARMUP:]),
        "peak_gib": max(r["memory_max_reserved_gib"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "neuron"))
    parser.add_argument("--cases", default=DEFAULT_CASES, help="flavor:seq_len,...")
    args = parser.parse_args()
    if args.steps <= WARMUP:
        sys.exit(f"--steps must exceed the {WARMUP} warm-up steps")

    work = Path(tempfile.mkdtemp(prefix="bench_compile_"))
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    results: dict[tuple, dict[str, list[dict]]] = {case: {"off": [], "on": []} for case in cases}
    for flavor, seq_len in cases:
        for r, order in enumerate(abba(args.rounds, ("off", "on"))):
            for mode in order:
                start = time.perf_counter()
                rows = run_case(work / f"{flavor}-{seq_len}-{r}-{mode}", flavor, seq_len, mode, args)
                results[(flavor, seq_len)][mode].append(summary(rows))
                print(
                    f"{flavor:11s} seq {seq_len:4d} round {r + 1} compile={mode:3s} "
                    f"wall {time.perf_counter() - start:6.1f} s  tokens/s {results[(flavor, seq_len)][mode][-1]['tps']:8.0f}",
                    flush=True,
                )

    def med(case, mode, key):
        return statistics.median(s[key] for s in results[case][mode])

    print(
        f"\ndevice {args.device}, {args.steps} steps, batch 1, {args.rounds} rounds (medians); warm-up = steps 1-{WARMUP}"
    )
    print(
        "| case | eager tokens/s | compiled tokens/s | ratio | compile s | break-even steps | peak GiB eager / compiled |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        eager, compiled = med(case, "off", "tps"), med(case, "on", "tps")
        compile_s = med(case, "on", "warmup_s") - med(case, "off", "warmup_s")
        saved = med(case, "off", "step_s") - med(case, "on", "step_s")
        breakeven = f"{WARMUP + compile_s / saved:.0f}" if saved > 0 else "never"
        print(
            f"| {case[0]} seq {case[1]} | {eager:.0f} | {compiled:.0f} | {compiled / eager:.2f}x | {compile_s:.1f} "
            f"| {breakeven} | {med(case, 'off', 'peak_gib'):.3f} / {med(case, 'on', 'peak_gib'):.3f} |"
        )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
