"""Ranges: every numeric field that has one, with the key, the value and the fix.

torch and torchtitan take many values that make no sense for training (a negative learning
rate trains; ``warmup_steps`` past ``steps`` never reaches the peak rate). These run first in
both pre-flight tiers, and a config with a value out of range stops here: the checks after
them divide by degrees and index by ranks, and assume sane values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from qwen3_trainium.config import devices, nodes, runconfig
from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight.problem import Problem


@dataclass(frozen=True)
class Range:
    key: str  # dotted, as typed on the command line
    ok: Callable[[object, RunConf], bool]
    needs: str  # what a valid value is, e.g. "> 0"
    fix: str  # a valid setting


def _get(run: RunConf, key: str):
    node = run
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _finite(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def _endpoint_ok(v) -> bool:
    try:
        nodes.parse_endpoint(v)
    except ValueError:
        return False
    return True


def _pos(v, _run) -> bool:
    return _finite(v) and v > 0


def _nonneg(v, _run) -> bool:
    return _finite(v) and v >= 0


def _at_least_1(v, _run) -> bool:
    return v >= 1


def _auto_or_at_least_1(v, _run) -> bool:
    return v == -1 or v >= 1


RANGES: tuple[Range, ...] = (
    Range("training.steps", _at_least_1, ">= 1", "training.steps=1000"),
    Range("training.seq_len", _at_least_1, ">= 1", "training.seq_len=256"),
    Range("training.local_batch_size", _at_least_1, ">= 1", "training.local_batch_size=8"),
    Range(
        "training.global_batch_size",
        _auto_or_at_least_1,
        "-1 (local_batch_size x data-parallel degree) or >= 1",
        "training.global_batch_size=-1",
    ),
    Range("training.max_norm", _pos, "> 0 (the gradient-norm clip)", "training.max_norm=1.0"),
    Range("training.gc_freq", _at_least_1, ">= 1 (steps between garbage collections)", "training.gc_freq=50"),
    Range("optimizer.lr", _pos, "> 0", "optimizer.lr=8e-4"),
    Range(
        "optimizer.betas",
        lambda v, _r: len(v) == 2 and all(_finite(b) and 0 <= b < 1 for b in v),
        "two values, each in [0, 1)",
        "optimizer.betas=[0.9,0.95]",
    ),
    Range("optimizer.eps", _pos, "> 0", "optimizer.eps=1e-8"),
    Range("optimizer.weight_decay", _nonneg, ">= 0", "optimizer.weight_decay=0.1"),
    Range(
        "lr_scheduler.warmup_steps",
        lambda v, r: 0 <= v and (v <= r.training.steps or r.training.steps < 1),  # steps < 1: its own
        "in [0, training.steps]",
        "lr_scheduler.warmup_steps=<at most training.steps>",
    ),
    Range(
        "lr_scheduler.decay_ratio",
        lambda v, _r: v is None or (_finite(v) and 0 <= v <= 1),
        "null (decay over all steps after warm-up) or in [0, 1]",
        "lr_scheduler.decay_ratio=null",
    ),
    Range(
        "lr_scheduler.min_lr_factor",
        lambda v, _r: _finite(v) and 0 <= v <= 1,
        "in [0, 1] (the final rate as a fraction of lr)",
        "lr_scheduler.min_lr_factor=0.0",
    ),
    Range(
        "parallel.data_parallel_replicate_degree",
        _at_least_1,
        ">= 1",
        "parallel.data_parallel_replicate_degree=1",
    ),
    Range(
        "parallel.data_parallel_shard_degree",
        _auto_or_at_least_1,
        "-1 (all remaining ranks) or >= 1",
        "parallel.data_parallel_shard_degree=-1",
    ),
    Range("parallel.tensor_parallel_degree", _at_least_1, ">= 1", "parallel.tensor_parallel_degree=1"),
    Range("parallel.pipeline_parallel_degree", _at_least_1, ">= 1", "parallel.pipeline_parallel_degree=1"),
    Range(
        "parallel.pipeline_parallel_microbatch_size",
        _at_least_1,
        ">= 1",
        "parallel.pipeline_parallel_microbatch_size=1",
    ),
    Range("parallel.context_parallel_degree", _at_least_1, ">= 1", "parallel.context_parallel_degree=1"),
    Range("parallel.expert_parallel_degree", _at_least_1, ">= 1", "parallel.expert_parallel_degree=1"),
    Range("parallel.auto_top", _at_least_1, ">= 1 (rows of the plan's table)", "parallel.auto_top=5"),
    Range(
        "parallel.auto_traces", _at_least_1, ">= 1 (the winner is always traced)", "parallel.auto_traces=3"
    ),
    Range("parallel.auto_budget", _at_least_1, ">= 1 (seconds)", "parallel.auto_budget=60"),
    Range("launcher.nnodes", _at_least_1, ">= 1", "launcher.nnodes=1"),
    Range(
        "launcher.nproc_per_node",
        _auto_or_at_least_1,
        "-1 (one per device) or >= 1",
        "launcher.nproc_per_node=-1",
    ),
    Range(
        "launcher.rdzv_port",
        lambda v, _r: 1 <= v <= 65535,
        "a TCP port in [1, 65535]",
        "launcher.rdzv_port=29500",
    ),
    Range(
        "launcher.node_rank",
        lambda v, r: v == -1 or 0 <= v < r.launcher.nnodes,
        "-1 (SLURM_NODEID, else 0) or in [0, launcher.nnodes)",
        "launcher.node_rank=-1",
    ),
    Range(
        "launcher.log_rank",
        lambda v, r: v >= 0 and (r.launcher.nproc_per_node == -1 or v < r.launcher.nproc_per_node),
        "a local rank: in [0, launcher.nproc_per_node)",
        "launcher.log_rank=0",
    ),
    Range("checkpoint.interval", _at_least_1, ">= 1 (steps between checkpoints)", "checkpoint.interval=500"),
    Range("checkpoint.keep_latest_k", _nonneg, ">= 0 (0 keeps all)", "checkpoint.keep_latest_k=10"),
    Range(
        "checkpoint.load_step",
        lambda v, _r: v >= -1,
        "-1 (the latest) or a step >= 0",
        "checkpoint.load_step=-1",
    ),
    Range("tracking.log_freq", _at_least_1, ">= 1 (steps between metric logs)", "tracking.log_freq=1"),
    Range(
        "tracking.expert_idle_warn_steps",
        _nonneg,
        ">= 0 (0: no idle-expert warning)",
        "tracking.expert_idle_warn_steps=100",
    ),
    Range(
        "debug.seed",
        lambda v, _r: v is None or 0 <= v < 2**63,
        "null or in [0, 2**63)",
        "debug.seed=42",
    ),
    Range("model.moe_block_size", _at_least_1, ">= 1", "model.moe_block_size=256"),
    Range("eval.freq", _at_least_1, ">= 1 (steps between validations)", "eval.freq=100"),
    Range(
        "eval.steps",
        # torchtitan's Validator.Config: "-1 ... there could be hangs due to mismatch among ranks"
        lambda v, r: v >= 1 or (v == -1 and runconfig.degrees(r).world == 1),
        ">= 1 batches (-1, the whole split, only with one rank: ranks that disagree on when it ends hang)",
        "eval.steps=8",
    ),
    Range("eval.sample_tokens", _nonneg, ">= 0 (0: no samples)", "eval.sample_tokens=24"),
    Range("data.preview", _nonneg, ">= 0 (0: no preview)", "data.preview=4"),
    Range("peft.rank", _at_least_1, ">= 1", "peft.rank=8"),
    Range("peft.alpha", _pos, "> 0 (the adapters are scaled by alpha / rank)", "peft.alpha=16"),
    Range(
        "eval.sample_prompts",
        lambda v, _r: all(str(p).strip() for p in v),
        "prompts with text (an empty one has nothing to continue)",
        "eval.sample_prompts='[The capital of France is]'",
    ),
    Range(
        "memory.timeout",
        _at_least_1,
        ">= 1 seconds (the trace of 8B at 64 ranks takes about 35)",
        "memory.timeout=600",
    ),
    Range(
        "launcher.rdzv_endpoint",
        lambda v, _r: v == "auto" or not v.strip() or _endpoint_ok(v),  # empty: NOT_EMPTY says so
        "auto or host[:port] as torchrun reads it (a port from 0 to 65535; 0: torchrun picks one)",
        "launcher.rdzv_endpoint=auto (one node: localhost:0)",
    ),
    Range(
        "data.validation_fraction",
        lambda v, _r: _finite(v) and 0 < v <= 0.5,
        "in (0, 0.5] (the share of records held out for eval=on)",
        "data.validation_fraction=0.05",
    ),
)


# Strings that must not be empty (where they are used): (key, used when, the fix)
NOT_EMPTY: tuple[tuple[str, Callable[[RunConf], bool], str], ...] = (
    ("data.dataset", lambda r: True, "data.dataset=c4_test"),
    ("data.dataset_path", lambda r: True, "data.dataset_path=<a directory>, or null for a Hub dataset"),
    (
        "data.validation_path",
        lambda r: r.eval.enable,
        "data.validation_path=null (the corpus's validation split, or data.validation_fraction of it)",
    ),
    ("checkpoint.folder", lambda r: r.checkpoint.enable, "checkpoint.folder=checkpoint"),
    ("checkpoint.hf_max_shard_size", lambda r: True, "checkpoint.hf_max_shard_size=5GB"),
    ("tracking.project", lambda r: r.tracking.wandb, "tracking.project=qwen3-trainium"),
    ("device.instance", lambda r: r.device.type.value == "neuron", "device.instance=trn2.48xlarge"),
    (
        "device.compile_cache",
        lambda r: r.device.type.value == "neuron",
        "device.compile_cache=~/.cache/neuron-neff",
    ),
    ("launcher.rdzv_endpoint", lambda r: True, "launcher.rdzv_endpoint=auto"),
    ("launcher.rdzv_id", lambda r: True, "launcher.rdzv_id=auto"),
)


def check_ranges(run: RunConf) -> list[Problem]:
    problems = [
        Problem(r.key, _get(run, r.key), f"out of range: must be {r.needs}", r.fix)
        for r in RANGES
        if not r.ok(_get(run, r.key), run)
    ]
    problems += [
        Problem(key, "", "empty", fix)
        for key, used, fix in NOT_EMPTY
        if _get(run, key) is not None and not str(_get(run, key)).strip() and used(run)
    ]
    return problems + _instance_capacity(run)


def _instance_capacity(run: RunConf) -> list[Problem]:
    """On Neuron, processes per node within the instance's logical cores at this LNC (each rank
    owns one logical NeuronCore). Elsewhere the count is held against the devices at launch."""
    launcher, device = run.launcher, run.device
    if (
        device.type.value != "neuron"
        or device.instance not in devices.NEURON_INSTANCES
        or device.lnc not in (1, 2)
    ):
        return []  # an unknown instance or LNC is check_device's problem
    cores = devices.NEURON_INSTANCES[device.instance].physical_cores // device.lnc
    if launcher.nproc_per_node <= cores:
        return []
    message = (
        f"a {device.instance} has {cores} logical NeuronCores at device.lnc={device.lnc}, one per process"
    )
    return [
        Problem(
            "launcher.nproc_per_node",
            launcher.nproc_per_node,
            message,
            f"launcher.nproc_per_node=<at most {cores}> (or -1: one per logical core)",
        )
    ]
