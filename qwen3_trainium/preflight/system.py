"""Pre-flight checks against the machine and the model's shape: versions, parallel degrees, and
device memory per rank (HBM on Trainium)."""

from __future__ import annotations

import importlib.metadata
import math

from qwen3_trainium import devices, memory, runconfig
from qwen3_trainium.preflight.problem import Problem
from qwen3_trainium.schema import ModelPath, RunConf

# package -> (required, why); "=2.14" means any 2.14.x
REQUIRED = {
    "torch": ("=2.14", "torch-neuronx 2.14.x pairs with torch 2.14; torchtitan 0.3.0 needs >= 2.14"),
    "torchtitan": ("=0.3.0", "the fields and seams this project targets"),
    "transformers": ("=5", "model=hf needs Transformers v5"),
    "hydra-core": ("=1.3", "version_base 1.3"),
}
NEURON_REQUIRED = {
    "torch-neuronx": ("=2.14", "must match torch's major.minor"),
    "neuronx-cc": ("", "the Neuron compiler"),
}


def installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _shown(required: str) -> str:
    if not required:
        return "any"
    version = required.lstrip("=")
    return version if version.count(".") == 2 else version + ".x"


def _matches(version: str, required: str) -> bool:
    if not required:
        return True
    want = required.lstrip("=").split(".")
    return version.split("+")[0].split(".")[: len(want)] == want


RECORDED = ("omegaconf", "wandb", "tensorboard", "hydra-optuna-sweeper", "hydra-submitit-launcher")


def installed_versions(run: RunConf) -> dict[str, str]:
    """The versions a run records (W&B summary, job.json): every checked package plus the
    tracking and sweep plugins; packages that are not installed are left out."""
    names = [*REQUIRED, *(NEURON_REQUIRED if run.device.type.value == "neuron" else ()), *RECORDED]
    return {name: version for name in names if (version := installed(name))}


def versions(run: RunConf, *, launching: bool) -> tuple[list[Problem], str]:
    """(problems, the table). Neuron packages are required when launching on Neuron; a wrong
    installed version is an error anywhere."""
    rows, problems = [], []
    wanted = dict(REQUIRED)
    if run.device.type.value == "neuron":
        wanted |= NEURON_REQUIRED
    for package, (required, why) in wanted.items():
        have = installed(package)
        ok = have is not None and _matches(have, required)
        if ok:
            status = "ok"
        elif have is None and package in NEURON_REQUIRED and not launching:
            status = "not here"  # a Trainium config validated on another machine
        elif package == "transformers" and run.model.path is not ModelPath.hf:
            status = "warn"  # only model=hf needs v5
        else:
            status = "MISSING" if have is None else "MISMATCH"
        rows.append(f"  {package:14s} {have or '-':16s} {_shown(required):10s} {status}")
        if status in ("MISSING", "MISMATCH"):
            need = required.lstrip("=") or "any"
            what = "not installed" if have is None else f"{have} installed"
            fix = (
                f"pip install '{package}=={need}.*'"
                if required
                else f"install {package} (Neuron pip repository)"
            )
            problems.append(Problem(f"versions.{package}", have, f"{what}; {why}: needs {need}", fix))
    table = "\n".join([f"  {'package':14s} {'installed':16s} {'required':10s}", *rows])
    return problems, table


def check_degrees(run: RunConf, shape: memory.ModelShape) -> tuple[list[Problem], str]:
    """(problems, the arithmetic) for the degrees against the world and the model."""
    par, launcher = run.parallel, run.launcher
    resolved = runconfig.degrees(run)
    world, shard = resolved.world, resolved.shard
    problems = []
    tp = par.tensor_parallel_degree
    for what, count in (("attention heads", shape.n_heads), ("KV heads", shape.n_kv_heads)):
        if count % tp:
            problems.append(
                Problem(
                    "parallel.tensor_parallel_degree",
                    tp,
                    f"does not divide the {count} {what}",
                    f"a divisor of {math.gcd(shape.n_heads, shape.n_kv_heads)}",
                )
            )
    ep = par.expert_parallel_degree
    if ep > 1 and (not shape.num_experts or shape.num_experts % ep):
        message = (
            f"does not divide the {shape.num_experts} experts"
            if shape.num_experts
            else "the model has no experts"
        )
        problems.append(
            Problem(
                "parallel.expert_parallel_degree",
                ep,
                message,
                "a divisor of num_experts (1 for dense flavors)",
            )
        )
    elif ep > 1 and (shard * par.context_parallel_degree) % ep:
        problems.append(
            Problem(
                "parallel.expert_parallel_degree",
                ep,
                f"must divide data_parallel_shard x context ({shard * par.context_parallel_degree})",
                "a divisor of the FSDP degree",
            )
        )
    if par.pipeline_parallel_degree > shape.n_layers:
        problems.append(
            Problem(
                "parallel.pipeline_parallel_degree",
                par.pipeline_parallel_degree,
                f"more stages than the {shape.n_layers} layers",
                f"at most {shape.n_layers}",
            )
        )
    sp = tp if par.enable_sequence_parallel else 1
    divisor = sp * (2 * par.context_parallel_degree if par.context_parallel_degree > 1 else 1)
    if run.training.seq_len % divisor:
        problems.append(
            Problem(
                "training.seq_len",
                run.training.seq_len,
                f"must be divisible by {divisor} (sequence parallel {sp} x context parallel)",
                f"a multiple of {divisor}",
            )
        )
    dp = par.data_parallel_replicate_degree * shard
    gbs = run.training.global_batch_size
    if gbs != -1 and gbs % (run.training.local_batch_size * dp):
        problems.append(
            Problem(
                "training.global_batch_size",
                gbs,
                f"not divisible by local_batch_size x data-parallel degree = {run.training.local_batch_size * dp}",
                f"a multiple of {run.training.local_batch_size * dp} (or -1)",
            )
        )
    arithmetic = (
        f"  world {world} = nnodes {launcher.nnodes} x nproc_per_node {launcher.nproc_per_node}"
        f" = dp_replicate {par.data_parallel_replicate_degree} x dp_shard {shard} x tp {tp}"
        f" x pp {par.pipeline_parallel_degree} x cp {par.context_parallel_degree} (ep {ep} within dp_shard x cp)"
    )
    return problems, arithmetic


def check_memory(run: RunConf, shape: memory.ModelShape) -> tuple[list[Problem], memory.Estimate]:
    shard = runconfig.degrees(run).shard
    info = devices.device_info(
        run.device.type.value,
        lnc=run.device.lnc,
        instance=run.device.instance,
        nproc=run.launcher.nproc_per_node,
    )
    est = memory.estimate(run, shape, dp_shard=shard, capacity=info.memory_per_rank)
    if est.capacity and est.total > est.capacity:
        message = f"estimated {est.total / memory.GiB:.1f} GiB per rank, over the {est.capacity / memory.GiB:.1f} GiB a rank has:\n{est.table()}"
        fix = "more sharding (parallel.*), activation_checkpoint.mode=selective|full, a smaller training.local_batch_size or seq_len"
        return [Problem("memory", f"{est.total / memory.GiB:.1f} GiB", message, fix)], est
    return [], est
