"""What ``bench/moe.py`` states beside its figures: the device and versions, which peak MFU is
taken against, which compile cache a run started from, and that both routes ran the same job."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

import yaml

from bench.common import ROOT
from qwen3_trainium.config import devices

NO_NEURON = (
    "bench-moe: --device neuron needs a Trainium host whose torch-neuronx sees a NeuronCore, and "
    "this one has none (no /dev/neuron*, or torch-neuronx missing): run it on a trn2 after "
    "`make setup-neuron`, or use --device cpu (make bench-moe DEVICE=cpu)"
)
PACKAGES = ("torch", "torchtitan", "torch-neuronx", "neuronx-cc", "nki", "transformers")
# Keys of resolved.yaml that may differ between the routes: the model path and its knobs (kernels,
# the blockwise block size and compute dtype, the attention backend: AWS's 2.34 grouped_mm recipes
# use "the models' own attention"), and what names the run.
ROUTE_KEYS = ("model.path", "model.kernels", "model.moe_", "model.attn_backend", "run_name", "override.")


def neuron_here() -> bool:
    """The project's own test: a Neuron device node and torch-neuronx seeing a NeuronCore."""
    return devices.detect_device_type() == "neuron"


def stamp() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def compile_cache(args, overrides: list[str], run_dir: Path) -> tuple[list[str], str]:
    """(extra overrides, the compile cache this run starts from). ``--cold``: a new empty
    ``device.compile_cache`` (the TORCH_NEURONX_NEFF_CACHE_DIR of every rank, config/devices.py
    rank_env). Otherwise the configured cache, described as it is before the run."""
    if args.device != "neuron":
        return [], "n/a (CPU eager)"
    if args.cold:
        fresh = run_dir.parent / f"{run_dir.name}-neff-cache"
        fresh.mkdir(parents=True, exist_ok=True)
        return [f"device.compile_cache={fresh}"], "cold (new, empty)"
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("device.compile_cache=")]
    default = yaml.safe_load((ROOT / "conf" / "device" / "neuron.yaml").read_text())["compile_cache"]
    path = Path(os.path.expanduser(given[-1] if given else default))
    files = sum(1 for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0
    return [], f"warm ({files} files)" if files else "cold (empty)"


def _flat(tree, prefix: str = "") -> dict[str, object]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, object] = {}
    for key, value in tree.items():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def job_differences(a: dict, b: dict) -> list[str]:
    """Keys of two resolved configs that differ, the route's own keys (ROUTE_KEYS) left out."""
    fa, fb = _flat(a), _flat(b)
    keys = sorted(k for k in fa.keys() | fb.keys() if not k.startswith(ROUTE_KEYS) and fa.get(k) != fb.get(k))
    return [f"{k}: {fa.get(k)!r} / {fb.get(k)!r}" for k in keys]


def same_job_or_exit(run_dirs: list[Path]) -> None:
    """Both routes must have run the same job (flavor, steps, batch, seq_len, seed, data, layout):
    otherwise the ratios compare two jobs, so the bench stops after its first round."""
    first, second = (yaml.safe_load((d / "resolved.yaml").read_text()) for d in run_dirs[:2])
    differ = job_differences(first, second)
    if differ:
        print(
            f"bench-moe: the two routes ran different jobs ({'; '.join(differ)}): give both the same overrides",
            file=sys.stderr,
        )
        sys.exit(2)


def mfu_peak(resolved: dict) -> str:
    """Which peak torchtitan's mfu(%) is against (rank/titan.py passes config/devices.py's)."""
    device = resolved["device"]
    if device["type"] != "neuron":
        return (
            f"n/a on {device['type']}: config/devices.py has no peak FLOPS for it, so the ranks log "
            "no mfu(%) (metrics.jsonl has no mfu_pct)"
        )
    lnc, instance = device["lnc"], device["instance"]
    peak = devices.device_info("neuron", lnc=lnc, instance=instance).peak_flops_per_rank
    per_core = devices.NEURON_INSTANCES[instance].peak_bf16_flops_per_physical_core
    return (
        f"torchtitan's mfu(%) against {peak / 1e12:.0f} TFLOPS dense BF16 per rank: "
        f"{per_core / 1e12:.0f} per NeuronCore-v3 x LNC {lnc} ({instance}; qwen3_trainium/config/devices.py)"
    )


def ttfi_text(device: str, cold: bool) -> str:
    what = "wall time from starting `python launch.py` to its first metrics.jsonl row (the end of step 1)"
    if device != "neuron":
        return f"{what}: Hydra, pre-flight, torchrun, model build and step 1, eager (no compile cache)"
    cache = (
        "every run cold (its own empty device.compile_cache, --cold)"
        if cold
        else ("cold or warm per run, as the compile-cache column says (--cold for all cold)")
    )
    return f"{what}, Neuron compilation of step 1's graphs included: {cache}"


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def context(args, first_run: Path) -> dict:
    resolved = yaml.safe_load((first_run / "resolved.yaml").read_text())
    device = resolved["device"]
    where = (
        f"neuron ({device['instance']}, LNC {device['lnc']})"
        if device["type"] == "neuron"
        else device["type"]
    )
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    )
    return {
        "device": where,
        "date": datetime.date.today().isoformat(),
        "git_commit": commit.stdout.strip() or "unknown",
        "host": f"{platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "versions": versions(),
        "mfu_peak": mfu_peak(resolved),
        "ttfi": ttfi_text(args.device, args.cold),
        "cold": args.cold,
    }
