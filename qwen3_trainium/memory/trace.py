"""``memory=trace``: the run's second training step, traced before launch.

A helper process (``python -m qwen3_trainium.memory.trace``, started by pre-flight) plays rank 0 of
the planned world on torchtitan's own fake process group (``comm.mode=fake_backend``, torch's
``fake`` backend: every collective returns at once, any world size on one CPU). It builds the
model as a rank does (``ParallelDims``, ``update_from_config``, ``override.imports``, the model
spec's ``parallelize_fn``, ``init_weights``, the optimizer), primes AdamW's states as a first
step leaves them (``tracing.prime_optimizer``), then runs one step (forward, backward, clip,
AdamW) through torchtitan's own ``Trainer._forward_backward_body`` (objective=dpo: the DPO
trainer's, ``dpo_trace.py``) under ``FakeTensorMode``: shapes, dtypes and storage sizes are real,
no byte is allocated and nothing touches a device. torch's ``MemTracker`` records the peak by kind
of tensor; the step also runs under the roofline (``roofline.py``). ``--first-step`` traces step
1's forward and backward as well (the old two-step trace: 25 % slower on Qwen3-30B-A3B, and it
counts one micro-batch's hidden state that only the tracker keeps alive).

torch's ``FSDPMemTracker`` would split FSDP's gathered parameters from the sharded ones, but it
refuses torchtitan's chunked loss, which calls the ``lm_head`` FSDP module once per chunk outside
the model's forward (``_fsdp_state_pre_forward``: "multiple iterative calls"), so the gathered
parameters count as parameters here.

It prints one JSON object on stdout (``Trace``); pre-flight turns it into the table and the
verdict against the rank's memory (``preflight/system.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

# MemTracker's kinds (torch/distributed/_tools/mem_tracker.py ``_MemRefType``), as the estimate
# groups them. FSDP's gathered (unsharded) parameters are module parameters while a layer runs.
PARTS = {
    "parameters (+ gathered)": ("Parameter", "Buffer"),
    "gradients": ("Gradient",),
    "optimizer states": ("Optstate",),
    "activations": ("Activation",),
    "backward temporaries": ("Temp",),
}


@dataclass
class Trace:
    world: int
    parts: dict[str, int]  # bytes per rank at the step's peak, by kind
    load_parts: dict[str, int] = field(default_factory=dict)  # initial_load_in_hf's peak (empty: none)
    step_seconds: float = 0.0  # roofline time of one step (0: no ceilings for this device)
    step_flops: float = 0.0  # FLOPs this rank's ops do in one step
    model_flops_per_token: float = 0.0  # torchtitan's count, for MFU as torchtitan reports it
    tokens_per_step: int = 0  # tokens one data-parallel rank trains on per step
    non_data_parallel: int = 1  # tp x pp x cp: ranks that share those tokens (torchtitan's tps)
    peak_bf16_flops: float = 0.0
    trace_seconds: float = 0.0

    @property
    def peak(self) -> int:
        return sum(self.parts.values())

    @property
    def load_peak(self) -> int:
        return sum(self.load_parts.values())

    @property
    def total(self) -> int:
        return max(self.peak, self.load_peak)

    @property
    def tokens_per_second(self) -> float:
        """Per rank, as torchtitan's metrics count it (tokens / time / non-data-parallel size)."""
        if not self.step_seconds:
            return 0.0
        return self.tokens_per_step / self.step_seconds / self.non_data_parallel

    @property
    def mfu(self) -> float:
        tflops = self.model_flops_per_token * self.tokens_per_second
        return tflops / self.peak_bf16_flops if self.peak_bf16_flops else 0.0


def _fake_world(world: int) -> None:
    """torchtitan's fake backend (``init_distributed`` with ``comm.mode=fake_backend``)."""
    from torchtitan.config.configs import CommConfig
    from torchtitan.distributed import utils as dist_utils

    os.environ["NGPU"], os.environ["RANK"] = str(world), "0"
    dist_utils.init_distributed(CommConfig(mode="fake_backend"))


class _Rank:
    """The parts of torchtitan's ``Trainer`` its step reads, with the step's own code."""

    def __init__(self, config, parallel_dims, model_config, model, loss_fn, cp_documents=None) -> None:
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.trainer import Trainer

        from qwen3_trainium.rank.context_parallel import ContextParallelAttention

        self.config, self.parallel_dims, self.model_config = config, parallel_dims, model_config
        self.model_parts, self.loss_fn, self.ntokens_seen = [model], loss_fn, 0
        self.device = "cpu"  # where the trace's tensors live (CP's input sharding reads it)
        self.train_context = dist_utils.get_spmd_context(parallel_dims=parallel_dims, spmd_typechecking=False)
        # the trainer's CP mask after torchtitan's sharding, as rank/context_parallel.py adds it
        self._cp_documents = cp_documents
        post = Trainer.post_dataloading_process.__get__(self)
        self._post = ContextParallelAttention._masked(self, post)

    def post_dataloading_process(self, input_dict, labels):
        return self._post(input_dict, labels)

    def _forward_backward_body(self, inputs, labels, global_valid_tokens, extra_kwargs):
        """torchtitan's; a subclass runs its trainer's own (``dpo_trace.dpo_rank``: rank/dpo.py's)."""
        from torchtitan.trainer import Trainer

        return Trainer._forward_backward_body(self, inputs, labels, global_valid_tokens, extra_kwargs)

    def rows(self):
        """(input_dict, labels) of the planned shape: one document per row, as the dataloader packs it."""
        import torch

        train = self.config.training
        tokens = torch.zeros(train.local_batch_size, train.seq_len, dtype=torch.long)
        positions = torch.arange(train.seq_len).repeat(train.local_batch_size, 1)
        return {"input": tokens, "positions": positions}, tokens.clone()

    def batch(self, fake_mode):
        import torch
        from torch.utils._pytree import tree_map_only

        inputs, labels, extra = self.post_dataloading_process(*self.rows())
        return tree_map_only(torch.Tensor, fake_mode.from_tensor, (inputs, labels, extra))

    def step(self, optimizers, batch) -> None:
        import torch
        from torchtitan.distributed import utils as dist_utils

        inputs, labels, extra = batch
        optimizers.zero_grad()
        self._forward_backward_body(inputs, labels, torch.tensor(labels.numel()), extra)
        params = [p for m in self.model_parts for p in m.parameters()]
        dist_utils.clip_grad_norm_(
            params,
            self.config.training.max_norm,
            foreach=True,
            pp_mesh=self.parallel_dims.get_optional_mesh("pp"),
            ep_enabled=self.parallel_dims.ep_enabled,
        )
        optimizers.step()


def _build(config, world: int):
    """The model as torchtitan's ``Trainer.__init__`` builds it: on the meta device, after
    ``update_from_config`` and ``override.imports``, then the spec's ``parallelize_fn``."""
    import torch
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.config.override import apply_overrides
    from torchtitan.distributed import ParallelDims
    from torchtitan.tools import utils

    spec = config.model_spec
    parallel_dims = ParallelDims.from_config(config.parallelism, world)
    model_config = spec.model
    model_config.update_from_config(config=config)
    if config.override.imports:
        apply_overrides(config.override, config)
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
        model = model_config.build()
    _, flops_per_token = model_config.get_nparams_and_flops(model, config.training.seq_len)
    model = spec.parallelize_fn(
        model,
        parallel_dims=parallel_dims,
        training=config.training,
        parallelism=config.parallelism,
        compile_config=config.compile,
        ac_config=config.activation_checkpoint,
        dump_folder=config.dump_folder,
    )
    return parallel_dims, model_config, model, flops_per_token


def trace(run, run_dir: str, ceilings=None, first_step: bool = False) -> Trace:
    """Rank 0's peak memory in the second training step of ``run`` at its planned world size, the
    ``initial_load_in_hf`` peak, and (with ``ceilings``, a ``devices.Roofline``) the step time."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from qwen3_trainium.config import cpu_device, runconfig
    from qwen3_trainium.memory import flash, tracing
    from qwen3_trainium.rank import titan

    start = time.perf_counter()
    cpu_device.install_rank_device("cpu")  # the mesh and every tensor on the CPU, all of them fake
    world = runconfig.degrees(run).world
    _fake_world(world)
    config = titan.to_trainer_config(run, run_dir)
    from qwen3_trainium.rank.context_parallel import use_context_parallel_attention

    cp_documents = use_context_parallel_attention(config)  # as the trainer does, before building
    parallel_dims, model_config, model, flops_per_token = _build(config, world)
    loss_fn = config.loss.build(compile_config=config.compile)
    rank_class = _Rank
    if config.dpo.enable:  # the DPO trainer's step (rank/dpo.py)
        from qwen3_trainium.memory.dpo_trace import dpo_rank

        rank_class = dpo_rank(_Rank)
    rank = rank_class(config, parallel_dims, model_config, model, loss_fn, cp_documents)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    batch = rank.batch(fake_mode)  # masks from real positions (nonzero has no fake shape)
    with fake_mode, flash.device_attention(run.device.type.value):  # the device's kernel (flash.py)
        model.to_empty(device="cpu")
        tracing.init_weights(model)
        model.train()
        if hasattr(loss_fn, "set_lm_head"):  # torchtitan's ChunkedLossWrapper, as Trainer sets it
            loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True
        optimizers = config.optimizer.build(model_parts=[model])
        result = _traced_steps(rank, optimizers, batch, ceilings, first_step)
    result.world, result.model_flops_per_token = world, float(flops_per_token)
    result.tokens_per_step = run.training.local_batch_size * run.training.seq_len
    par = run.parallel
    result.non_data_parallel = (
        par.tensor_parallel_degree * par.pipeline_parallel_degree * par.context_parallel_degree
    )
    if run.checkpoint.enable and run.checkpoint.initial_load_in_hf:
        result.load_parts = tracing.load_parts(model)
    result.trace_seconds = time.perf_counter() - start
    return result


def _traced_steps(rank: _Rank, optimizers, batch, ceilings, first_step: bool = False) -> Trace:
    """AdamW's states primed (or, with ``first_step``, step 1 traced), then a step under the tracker
    and the roofline; the peak by kind at the moment of the peak."""
    from qwen3_trainium.memory import tracing
    from qwen3_trainium.memory.roofline import RooflineMode

    tracker = tracing.step_tracker()
    tracker.track_external(rank.model_parts[0], *optimizers.optimizers)
    with tracker, tracing.adapted(tracker):
        if first_step:  # the first step's forward and backward too (the primed trace's check)
            rank.step(optimizers, batch)
        else:
            tracing.prime_optimizer(rank.model_parts, optimizers)
        tracker.reset_mod_stats()  # per-module stats only; the peak is kept
        timing = RooflineMode(ceilings, skip=lambda: tracker.propagating) if ceilings else None
        with timing or contextlib.nullcontext():
            rank.step(optimizers, batch)
    by_kind: dict[str, int] = {}
    for per_device in tracker.get_tracker_snapshot("peak").values():
        for kind, value in per_device.items():
            key = getattr(kind, "value", str(kind))
            by_kind[key] = by_kind.get(key, 0) + value
    parts = {name: sum(by_kind.get(k, 0) for k in kinds) for name, kinds in PARTS.items()}
    result = Trace(world=0, parts=parts)
    if timing:
        result.step_seconds, result.step_flops = timing.seconds, timing.flops
        result.peak_bf16_flops = ceilings.bf16_flops
    return result


def ceilings_for(run):
    """The roofline ceilings of one rank of ``run``'s device (None where the table has none)."""
    from qwen3_trainium.config import devices

    if run.device.type.value != "neuron":
        return None
    return devices.NEURON_INSTANCES[run.device.instance].roofline_per_rank(run.device.lnc)


def main(argv: list[str] | None = None) -> int:
    """``python -m qwen3_trainium.memory.trace RUN_DIR RESOLVED_YAML [--ceilings BF16,FP32,BYTES_PER_S[,OP_S]]``:
    the trace as one JSON line on stdout (the ceilings, when given, replace the device table's)."""
    import argparse

    from qwen3_trainium.config import devices, runconfig

    parser = argparse.ArgumentParser(prog="python -m qwen3_trainium.memory.trace")
    parser.add_argument("run_dir")
    parser.add_argument("config")
    parser.add_argument("--ceilings", type=lambda v: devices.Roofline(*map(float, v.split(","))))
    parser.add_argument(
        "--first-step",
        action="store_true",
        help="trace step 1's forward and backward too, not only AdamW's states",
    )
    args = parser.parse_args(argv)
    run = runconfig.load(args.config)
    ceilings = args.ceilings or ceilings_for(run)
    with contextlib.redirect_stdout(sys.stderr):  # torchtitan's logs stay off the JSON
        result = trace(run, args.run_dir, ceilings, args.first_step)
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
