"""The two MoE routes on the same job, side by side: grouped_mm (``model=native``, torchtitan's
GroupedExperts on ``torch._grouped_mm``) against blockwise NKI (``model=nki_moe``).

AWS's Neuron SDK 2.34 TorchTitan recipes moved their MoE to ``torch._grouped_mm`` and report about
1.3x the MFU of their 2.33 recipes (blockwise NKI kernels, sdpa) for Qwen3-30B-A3B on TP4 x FSDP16,
and about 60 % lower cold time to first iteration (torch-neuronx release notes, v2.34.0:
https://github.com/aws-neuron/torch-neuronx/releases/tag/v2.34.0). This bench measures both here.

Runs interleaved (ABBA over --rounds) through ``python launch.py``; from each run's metrics.jsonl:
tokens/s and MFU (medians after the warm-up steps), time to first iteration (TTFI: from starting
launch.py to its first metrics row, the end of step 1) and peak memory. Prints the medians and the
ratios grouped_mm / nki_moe, and writes bench_moe.md and bench_moe.json to --out.

- ``--device cpu`` (default): the smoke job on the tiny MoE (``model.flavor=tiny_moe smoke=on``).
- ``--device neuron``: Qwen3-30B-A3B on one trn2.48xlarge, TP4 x FSDP16, seq 4096, batch 1
  (``experiment=qwen3_30b_a3b_trn2`` against ``experiment=qwen3_30b_a3b_trn2_nki_moe``).
  ``--cold`` gives every run an empty Neuron compile cache (``device.compile_cache``).
- ``--grouped-mm-job``/``--nki-moe-job "OVERRIDES"`` replace a route's job (e.g. the FSDP-64
  layout: ``experiment=qwen3_30b_a3b_trn2_dp64``, ``..._nki_moe_dp64``); positional overrides are
  added to both routes' jobs.

    python bench/moe.py [--device cpu|neuron] [--rounds 2] [--steps N] [--cold] [--out DIR] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import moe_facts  # noqa: E402
from bench import moe_report as report  # noqa: E402
from bench.common import ROOT, abba, started_and_wall  # noqa: E402
from qwen3_trainium.shared.contract import METRICS_NAME, read_metrics  # noqa: E402

_TINY_SMOKE = ["device=cpu", "model.flavor=tiny_moe", "smoke=on"]
JOBS = {
    # The smoke job (10 steps, batch 1; --steps sets the count) on the tiny MoE, on CPU wherever run.
    "cpu": {"grouped_mm": ["model=native", *_TINY_SMOKE], "nki_moe": ["model=nki_moe", *_TINY_SMOKE]},
    # The headline job as AWS's 2.34 recipes run it (Qwen3-30B-A3B, TP4 x FSDP16, seq 4096, batch 1,
    # selective activation checkpointing) and the same job on the blockwise NKI route.
    "neuron": {
        "grouped_mm": ["experiment=qwen3_30b_a3b_trn2"],
        "nki_moe": ["experiment=qwen3_30b_a3b_trn2_nki_moe"],
    },
}
# (rounds, steps, warm-up steps): on Neuron step 2 may still compile (the backward's graphs).
DEFAULTS = {"cpu": (2, 5, 1), "neuron": (2, 20, 2)}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/moe.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "neuron"))
    parser.add_argument("--rounds", type=int, help="ABBA rounds (default 2)")
    parser.add_argument("--steps", type=int, help="training steps per run (default: cpu 5, neuron 20)")
    parser.add_argument("--warmup", type=int, help="first steps left out of tokens/s (cpu 1, neuron 2)")
    parser.add_argument("--cold", action="store_true", help="an empty compile cache for every run (neuron)")
    parser.add_argument(
        "--grouped-mm-job", metavar="OVERRIDES", help="grouped_mm's job instead of the default"
    )
    parser.add_argument("--nki-moe-job", metavar="OVERRIDES", help="nki_moe's job instead of the default")
    parser.add_argument("--out", type=Path, help="report directory (default runs/bench_moe/<time>)")
    parser.add_argument("overrides", nargs="*", default=[], help="Hydra overrides added to both jobs")
    args = parser.parse_args(argv)
    rounds, steps, warmup = DEFAULTS[args.device]
    args.rounds = rounds if args.rounds is None else args.rounds
    args.steps = steps if args.steps is None else args.steps
    args.warmup = warmup if args.warmup is None else args.warmup
    if args.rounds < 1 or args.warmup < 1:
        parser.error(f"--rounds {args.rounds} and --warmup {args.warmup} must be at least 1")
    if args.steps <= args.warmup:
        parser.error(f"--steps {args.steps} must exceed --warmup {args.warmup}: no step left to measure")
    if args.cold and args.device != "neuron":
        parser.error("--cold picks a fresh Neuron compile cache: it needs --device neuron")
    return args


def jobs(args: argparse.Namespace) -> dict[str, list[str]]:
    """route -> its launch.py overrides; positional overrides last, so they win."""
    given = {"grouped_mm": args.grouped_mm_job, "nki_moe": args.nki_moe_job}
    out = {}
    for route in report.ROUTES:
        own = shlex.split(given[route]) if given[route] else JOBS[args.device][route]
        out[route] = [*own, "tracking=off", f"training.steps={args.steps}", *args.overrides]
    return out


def run_once(args, route: str, overrides: list[str], run_dir: Path) -> dict:
    """One launch.py run of a route; its summary row."""
    extra, cache = moe_facts.compile_cache(args, overrides, run_dir)
    argv = [sys.executable, "launch.py", *overrides, *extra, f"hydra.run.dir={run_dir}"]
    started, wall = started_and_wall(argv)
    rows = read_metrics(str(run_dir))
    if len(rows) <= args.warmup:
        sys.exit(
            f"bench-moe: {route} wrote {len(rows)} row(s) to {run_dir / METRICS_NAME}, none after the warm-up"
        )
    summary = report.summarize(rows, warmup=args.warmup, started=started)
    return {"route": route, "wall_s": wall, "compile_cache": cache, "run_dir": str(run_dir), **summary}


def measure(args, routes: dict[str, list[str]], out: Path) -> list[dict]:
    runs = []
    for r, order in enumerate(abba(args.rounds, report.ROUTES)):
        for route in order:
            row = {"round": r + 1, **run_once(args, route, routes[route], out / "runs" / f"{r + 1}-{route}")}
            runs.append(row)
            print(
                f"round {r + 1}/{args.rounds}  {route:10s}  tokens/s {row['tokens_per_second']:9.1f}  "
                f"TTFI {row['ttfi_s']:7.2f} s  wall {row['wall_s']:7.1f} s",
                flush=True,
            )
        if r == 0:
            moe_facts.same_job_or_exit([Path(run["run_dir"]) for run in runs])
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "neuron" and not moe_facts.neuron_here():
        print(moe_facts.NO_NEURON, file=sys.stderr)
        return 2
    out = (args.out or ROOT / "runs" / "bench_moe" / moe_facts.stamp()).resolve()
    out.mkdir(parents=True, exist_ok=True)
    routes = jobs(args)
    runs = measure(args, routes, out)
    memory_key = report.headline_memory_key(runs)
    med = report.medians(runs, memory_key)
    result = {
        **moe_facts.context(args, Path(runs[0]["run_dir"])),
        "jobs": routes,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "memory_key": memory_key,
        "runs": runs,
        "medians": med,
        "ratios": report.ratios(med),
    }
    (out / "bench_moe.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "bench_moe.md").write_text(report.markdown(result))
    print(
        f"\n{args.device}: {args.rounds} round(s), {args.steps} steps, medians after {args.warmup} warm-up step(s)"
    )
    print(report.medians_table(med, result["ratios"]))
    print(f"MFU: {result['mfu_peak']}\nTTFI: {result['ttfi']}\nreport: {out / 'bench_moe.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
