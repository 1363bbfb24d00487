"""Memory before launch against memory measured: estimate, trace and the run's peak, per case.

    python -m bench.memory [--cases tiny,debugmodel,tiny_moe,tiny_moe_nki,0.6B-2layer]
                           [--ranks 1,2] [--ac none,selective,full] [--steps 3] [--batch B --seq S]

For each case (model x ranks x activation checkpointing) it runs ``launch.py ... dry_run=true``
(the estimate), the trace helper (``memtrace.py``), then the run itself on the CPU,
and prints per rank: the estimate, the traced peak, the measured peak (the fullest rank's
``memory_max_all_ranks_gib``: resident set added since the model was defined, ``devices.py``,
with glibc's mmap threshold fixed, see ``ALLOCATOR``),
trace / measured, and whether the trace is within 5 %. ``0.6B-2layer`` is Qwen3-0.6B's published
config.json cut to 2 layers, as an HF directory of the Hub's layout (sparse safetensors), loaded
with ``checkpoint=hf_finetune`` (the HF load included). ``tiny_moe`` is torchtitan's grouped
experts (float32 on CPU), ``tiny_moe_nki`` the blockwise op on the fused experts; both at the
token count in ``SHAPES``. The roofline tokens/s, on this CPU's own ceilings (a matmul and a copy
measured here per rank), is printed beside the measured tokens/s: information, not a goal.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT

GiB = 2**30
BASE = ["smoke=on", "tracking=off", "preflight_cache=false"]
MODELS = {
    "tiny": ["model=native", "model.flavor=tiny"],
    "debugmodel": ["model=native", "model.flavor=debugmodel"],
    # bfloat16 experts: torch's fake _grouped_mm has no float32 (pre-flight says so)
    "tiny_moe": ["model=native", "model.flavor=tiny_moe"],  # float32 grouped experts (CPU's default)
    "tiny_moe_nki": ["model=nki_moe", "model.flavor=tiny_moe"],  # the blockwise op, fused experts
}
# (local_batch_size, seq_len) per case. The MoE cases route 8 x 1024 tokens, so that what is
# measured is the experts' memory, not the ~40 MB every process adds (below: at 2 x 256 that alone
# is a quarter of tiny_moe's peak, and every case of that size misses by it).
SHAPES = {"tiny_moe": (8, 1024), "tiny_moe_nki": (8, 1024)}


def cut_qwen3_0_6b(directory: Path) -> list[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from support.hub_layout import write_hub_model
    from support.published_configs import PUBLISHED

    config = dict(PUBLISHED["Qwen/Qwen3-0.6B"][3], num_hidden_layers=2, max_window_layers=2)
    write_hub_model(directory, config, shards=1, tokenizer_dir=ROOT / "qwen3_trainium/data/tokenizer")
    return [
        "model=hf",
        f"model.hf_model={directory}",
        "checkpoint=hf_finetune",
        f"checkpoint.initial_load_path={directory}",
    ]


# glibc keeps freed heap memory, and its mmap threshold grows with every large free (up to
# 32 MiB): the resident peak of a run then exceeds its live tensors by what fragmentation holds
# (debugmodel, 1 rank, AC full: 0.98 GiB measured by default, 0.61 GiB with this; traced 0.56).
# With the threshold fixed at 64 KiB every tensor above it is a mapping of its own, returned on
# free, so the resident set follows the live tensors, as a device allocator's peak does.
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def _launch(args: list[str], env: dict | None = None) -> str:
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "launch.py", *args], cwd=ROOT, capture_output=True, text=True, env=full_env
    )
    if proc.returncode:
        raise RuntimeError((proc.stdout + proc.stderr)[-1500:])
    return proc.stdout + proc.stderr


def _gib(text: str, label: str) -> float | None:
    m = re.search(rf"{re.escape(label)}\s+([\d.]+) GiB", text)
    return float(m.group(1)) if m else None


def measured(run_dir: Path) -> tuple[float, float]:
    """(peak GiB of the fullest rank, median tokens/s after step 1) from metrics.jsonl."""
    from qwen3_trainium.parent.report import read_metrics

    rows = read_metrics(str(run_dir))
    peak = max(r.get("memory_max_all_ranks_gib", 0) for r in rows)
    tps = sorted(r["tokens_per_second"] for r in rows[1:] if "tokens_per_second" in r)
    return peak, tps[len(tps) // 2] if tps else 0.0


def resolved(args: list[str], path: Path) -> Path:
    """The run config ``launch.py ARGS`` would resolve, saved for the trace helper."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    compose.register()
    compose.register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=args)
    return Path(compose.save(compose.resolve(cfg, str(ROOT)), str(path.parent), path.name))


def cpu_ceilings(threads: int) -> tuple[float, float, float]:
    """(bfloat16 FLOP/s, float32 FLOP/s, copy bytes/s) of one rank's threads here, best of 5:
    a 1024^3 matmul and a 64 MiB copy."""
    import torch

    torch.set_num_threads(threads)
    best = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        best[name] = 2 * 1024**3 / min(times)
    src, dst = torch.empty(2**24), torch.empty(2**24)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return best["bf16"], best["fp32"], 2 * src.numel() * 4 / min(times)


def traced(args: list[str], ranks: int, work: Path) -> dict:
    """The trace helper on this run, with this CPU's ceilings for the roofline."""
    config = resolved(args, work / "trace" / "resolved.yaml")
    ceilings = cpu_ceilings(max((os.cpu_count() or 1) // ranks, 1))
    command = [sys.executable, "-m", "qwen3_trainium.memory.trace", str(config.parent), str(config)]
    proc = subprocess.run(
        [*command, *map(str, ceilings)], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1])
    from qwen3_trainium.memory.trace import Trace

    return Trace(**json.loads(proc.stdout.strip().splitlines()[-1]))


def case(name: str, model: list[str], ranks: int, ac: str, opts, work: Path) -> dict:
    args = [*BASE, *model, f"launcher.nproc_per_node={ranks}", f"activation_checkpoint.mode={ac}"]
    batch, seq = SHAPES.get(name, (2, 256))
    batch, seq = opts.batch or batch, opts.seq or seq
    args += [f"training.steps={opts.steps}", f"training.local_batch_size={batch}", f"training.seq_len={seq}"]
    dry = _launch([*args, "dry_run=true", f"hydra.run.dir={work / 'dry'}"])
    trace = traced(args, ranks, work)
    run_dir = work / "run"
    _launch([*args, f"hydra.run.dir={run_dir}"], env=ALLOCATOR)
    peak, tps = measured(run_dir)
    return {
        "case": f"{name} {ranks}r ac={ac} T={batch}x{seq}",
        "estimate": _gib(dry, "total per rank"),
        "trace": trace.total / GiB,
        "measured": peak,
        "tps": tps,
        "roofline_tps": trace.tokens_per_second,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="tiny,debugmodel,tiny_moe,tiny_moe_nki,0.6B-2layer")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--ac", default="none,selective,full")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, help="training.local_batch_size (default: per case, SHAPES)")
    parser.add_argument("--seq", type=int, help="training.seq_len (default: per case, SHAPES)")
    opts = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        work = Path(tmp)
        models = dict(MODELS)
        models["0.6B-2layer"] = cut_qwen3_0_6b(work / "Qwen3-0.6B-2layer")
        for name in opts.cases.split(","):
            for ranks in map(int, opts.ranks.split(",")):
                for ac in opts.ac.split(","):
                    slot = work / f"{name}-{ranks}-{ac}"
                    try:
                        rows.append(case(name, models[name], ranks, ac, opts, slot))
                    except RuntimeError as error:
                        rows.append(
                            {"case": f"{name} {ranks}r ac={ac}", "error": str(error).strip().splitlines()[-1]}
                        )
                    print(_line(rows[-1]), flush=True)
    traced = [r for r in rows if r.get("trace")]
    within = [r for r in traced if abs(r["trace"] / r["measured"] - 1) <= 0.05]
    print(
        f"\ntrace within 5% of the measured peak: {len(within)} of {len(traced)} traced cases ({len(rows)} in all)"
    )
    if traced:  # what the CPU adds that no tensor holds: the median of measured - trace
        base = sorted(r["measured"] - r["trace"] for r in traced)[len(traced) // 2]
        close = [r for r in traced if abs((r["trace"] + base) / r["measured"] - 1) <= 0.05]
        print(f"fixed baseline (median of measured - trace): {base:.3f} GiB")
        for r in traced:
            print(
                f"  {r['case']:32s} (trace + baseline) / measured {(r['trace'] + base) / r['measured']:5.2f}"
            )
        print(f"trace + baseline within 5%: {len(close)} of {len(traced)}")


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['case']:32s} not traced: {r['error'][:110]}"
    ratio = r["trace"] / r["measured"] if r["measured"] else float("nan")
    return (
        f"{r['case']:32s} estimate {r['estimate']:7.3f}  trace {r['trace']:7.3f}  measured {r['measured']:7.3f} GiB"
        f"  trace/measured {ratio:5.2f} {'ok' if abs(ratio - 1) <= 0.05 else 'MISS'}"
        f"  estimate/measured {r['estimate'] / r['measured']:5.2f}"
        f"  tokens/s: roofline {r['roofline_tps']:7.0f} measured {r['tps']:7.0f}"
        f" ({r['roofline_tps'] / r['tps']:.1f}x)"
    )


if __name__ == "__main__":
    main()
