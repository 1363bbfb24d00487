"""Pre-flight checks against the model's shape: parallel degrees, and device memory per rank
(HBM on Trainium). The software stack is checked in ``stack.py``."""

from __future__ import annotations

import math

from qwen3_trainium import devices, memory, runconfig
from qwen3_trainium.preflight.problem import Problem
from qwen3_trainium.schema import RunConf


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
