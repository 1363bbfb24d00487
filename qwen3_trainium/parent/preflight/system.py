"""Pre-flight checks against the model's shape: parallel degrees, and device memory per rank
(HBM on Trainium). The software stack is checked in ``stack.py``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from qwen3_trainium.config import devices, runconfig
from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.memory import estimate
from qwen3_trainium.parent import compose
from qwen3_trainium.parent.preflight.problem import Problem
from qwen3_trainium.shared import lifeline


def check_degrees(run: RunConf, shape: estimate.ModelShape) -> tuple[list[Problem], str]:
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
    # with context parallel, context.py checks seq_len against all of CP's rules (this one included)
    if par.context_parallel_degree == 1 and run.training.seq_len % sp:
        problems.append(
            Problem(
                "training.seq_len",
                run.training.seq_len,
                f"must be divisible by {sp} (sequence parallel: tensor_parallel_degree)",
                f"a multiple of {sp}",
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


MEMORY_FIX = "more sharding (parallel.*), activation_checkpoint.mode=selective|full, a smaller training.local_batch_size or seq_len"


def check_memory(run: RunConf, shape: estimate.ModelShape) -> tuple[list[Problem], estimate.Estimate]:
    shard = runconfig.degrees(run).shard
    info = devices.device_info(
        run.device.type.value,
        lnc=run.device.lnc,
        instance=run.device.instance,
        nproc=run.launcher.nproc_per_node,
    )
    est = estimate.estimate(run, shape, dp_shard=shard, capacity=info.memory_per_rank)
    if est.capacity and est.total > est.capacity:
        has = f"the {est.capacity / estimate.GiB:.1f} GiB a rank has"
        if run.device.type.value == "cpu":
            nproc = run.launcher.nproc_per_node
            has += f" (this host's available memory / {nproc} ranks, less {devices.RANK_BASE_BYTES / estimate.GiB:.2f} GiB each for Python and torch)"
        message = f"estimated {est.total / estimate.GiB:.1f} GiB per rank, over {has}:\n{est.table()}"
        return [Problem("memory", f"{est.total / estimate.GiB:.1f} GiB", message, MEMORY_FIX)], est
    return [], est


TRACE_CONFIG = "memtrace.yaml"
TRACE_FIX = "memory=estimate (the analytic estimate), or a smaller training.local_batch_size or seq_len"


def run_trace(run: RunConf, run_dir: str) -> tuple[dict | None, str]:
    """(the trace, "") from a helper process (``memory/trace.py``), or (None, why it failed); the
    layout ``parallel=auto`` chose was traced by the plan already."""
    if run.parallel.auto:
        from qwen3_trainium.parent.auto import winner

        planned = winner.planned_trace(run, run_dir)
        if planned is not None:
            return planned, ""
    path = compose.save(run, run_dir, TRACE_CONFIG)
    command = [sys.executable, "-m", "qwen3_trainium.memory.trace", run_dir, path]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # fake tensors compute nothing
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=run.memory.timeout, env=env,
            preexec_fn=lifeline.preexec(os.getpid()),  # a trace of minutes dies with the launcher
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"the trace took longer than memory.timeout={run.memory.timeout} s"
    finally:
        os.remove(path)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or ["no output"]
        return None, f"the trace failed (exit {done.returncode}): {last[0].strip()}"
    return json.loads(lines[-1]), ""


def check_trace(run: RunConf, run_dir: str, capacity: int | None, notes: list[str]) -> list[Problem]:
    """memory=trace: the traced peak per rank against the rank's memory (over: refused; above
    90%: a warning), with its breakdown, the HF load's peak and, on Neuron, the step time."""
    from qwen3_trainium.memory.trace import Trace

    if run.parallel.pipeline_parallel_degree > 1:
        return [Problem("memory", "trace", "pipeline parallel runs are not traced", "memory=estimate")]
    data, why = run_trace(run, run_dir)
    if data is None:
        return [Problem("memory", "trace", why, TRACE_FIX)]
    trace = Trace(**data)
    table = trace_table(trace, capacity)
    notes.append(table)
    if trace.step_seconds:
        notes.append(step_line(trace))
    if capacity and trace.total > capacity:
        over = f"traced {trace.total / estimate.GiB:.2f} GiB per rank, over the {capacity / estimate.GiB:.2f} GiB a rank has"
        message = f"{over}:\n{table.split(chr(10), 1)[1]}"
        return [Problem("memory", f"{trace.total / estimate.GiB:.2f} GiB", message, MEMORY_FIX)]
    if capacity and trace.total > 0.9 * capacity:
        notes.append(
            f"WARNING the traced peak is {100 * trace.total / capacity:.0f}% of a rank's device memory"
        )
    return []


def trace_table(trace, capacity: int | None) -> str:
    def rows(parts: dict[str, int]) -> list[str]:
        return [f"  {name:28s} {value / estimate.GiB:8.3f} GiB" for name, value in parts.items()]

    lines = [
        f"device memory per rank (traced: the second step as rank 0 of {trace.world}, {trace.trace_seconds:.0f} s):"
    ]
    lines += rows(trace.parts) + [f"  {'step peak':28s} {trace.peak / estimate.GiB:8.3f} GiB"]
    if trace.load_parts:
        lines += ["  initial_load_in_hf:"] + rows(trace.load_parts)
        lines.append(f"  {'load peak':28s} {trace.load_peak / estimate.GiB:8.3f} GiB")
    if capacity:
        share = f"{100 * trace.total / capacity:.0f}%"
        lines.append(f"  {'device memory per rank':28s} {capacity / estimate.GiB:8.3f} GiB (peak {share})")
    return "\n".join(lines)


def step_line(trace) -> str:
    return (
        f"step time (roofline, communication not modelled): {trace.step_seconds:.3f} s, "
        f"{trace.tokens_per_second:,.0f} tokens/s per rank, MFU {100 * trace.mfu:.1f}%"
        f" of {trace.peak_bf16_flops / 1e12:,.0f} BF16 TFLOPS per rank"
    )
