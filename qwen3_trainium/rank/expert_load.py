"""Expert load you can see (docs/expert_load.md): tokens per expert of every MoE layer, summed over
the ranks, as ``moe/*`` figures in metrics.jsonl, W&B and TensorBoard, a warning for idle experts,
and the run's totals in ``expert_load.json``, which the end-of-run heatmap is drawn from.

Source: torchtitan's ``MoE.tokens_per_expert_E`` (``torchtitan/models/common/moe.py``, ``forward``:
``self.tokens_per_expert_E.add_(routing_map.sum((0, 1)))`` in training mode), which both routes
update (model=nki_moe replaces only ``RoutedExperts``, not ``MoE.forward``). It is zeroed only by
torchtitan's bias hook (``register_moe_load_balancing_hook``, an optimizer step pre-hook, when
``load_balance_coeff`` is set). So ``LoadCounter.read`` runs as an optimizer step pre-hook placed
FIRST in the container's ``_optimizer_step_pre_hooks`` (torch runs them in that dict's order,
``torch/optim/optimizer.py``: ``profile_hook_step``): it sees the step's counts before
torchtitan's hook reads and zeroes them, and zeroes them itself when no such hook exists. It
reduces them as torchtitan's hook does: halved in a block that activation checkpointing
recomputes (both torchtitan policies re-run the whole block, ``early_stop=False``), summed over
TP when EP and TP are on, then over the ``loss`` mesh (dp and cp: the ranks holding different
tokens). Per step: one ``[layers, experts]`` all-reduce, device-side sums; the host sees the counts
at log steps only. A dense model has no MoE block: nothing is registered, nothing costs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl
from torch.distributed.tensor import DTensor
from torchtitan.tools.logging import logger

from qwen3_trainium.rank import expert_figures
from qwen3_trainium.shared.contract import RUN_DIR_ENV


@dataclass(kw_only=True, slots=True)
class ExpertLoadConfig:
    """``tracking.expert_idle_warn_steps`` (0: no warning)."""

    idle_warn_steps: int = 100


def config(run) -> ExpertLoadConfig:
    """The trainer's ``expert_load`` field from the run config."""
    return ExpertLoadConfig(idle_warn_steps=run.tracking.expert_idle_warn_steps)


def moe_blocks(model_parts) -> list[tuple[int, torch.nn.Module, torch.nn.Module]]:
    """(layer id, transformer block, its ``MoE``) of every MoE layer of torchtitan decoders; none
    for dense models and for Transformers models (model=hf), which have no ``layers`` dict."""
    found = []
    for part in model_parts:
        layers = getattr(part, "layers", None)
        if not isinstance(layers, torch.nn.ModuleDict):
            continue
        for layer_id, block in layers.items():
            moe = getattr(block, "moe", None) if getattr(block, "moe_enabled", False) else None
            if moe is not None and hasattr(moe, "tokens_per_expert_E"):
                found.append((int(layer_id), block, moe))
    return found


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _recomputed(block: torch.nn.Module) -> bool:
    # torchtitan's own test (``_is_recomputation_enabled``): its FullAC and SelectiveAC wrappers
    # are non-reentrant checkpoints that re-run the whole block, so MoE.forward counts twice
    return getattr(block, "checkpoint_impl", None) is CheckpointImpl.NO_REENTRANT


def run_first(optimizers, hook) -> None:
    """Register ``hook()`` as a step pre-hook of ``optimizers`` that runs before all the others."""
    handle = optimizers.register_step_pre_hook(lambda *args, **kwargs: hook())
    optimizers._optimizer_step_pre_hooks.move_to_end(handle.id, last=False)


class LoadCounter:
    """The step counts of ``blocks`` (``moe_blocks``), their streaks of idle steps, and sums."""

    def __init__(self, blocks, parallel_dims, *, idle_warn_steps: int, run_dir: str, writer: bool):
        self.blocks, self.parallel_dims = blocks, parallel_dims
        self.idle_warn_steps, self.run_dir, self.writer = idle_warn_steps, run_dir, writer
        self.layers = [layer_id for layer_id, _, _ in blocks]
        self.top_k = int(getattr(blocks[0][2].router, "top_k", 0))
        local = _local(blocks[0][2].tokens_per_expert_E)
        shape = (len(blocks), local.numel())
        self.window = torch.zeros(shape, dtype=torch.float32, device=local.device)
        self.idle = torch.zeros(shape, dtype=torch.int32, device=local.device)
        self.warned = torch.zeros(shape, dtype=torch.bool, device=local.device)
        self.totals = torch.zeros(shape, dtype=torch.float64)
        self.first_step: int | None = None
        self.last_step = 0

    def read(self, step: int) -> None:
        """The counts of training step ``step`` over all ranks, added to the window; the buffers
        zeroed (an optimizer step pre-hook)."""
        if self.first_step is None:  # a resumed run's first step is past 1
            self.first_step = step
        with torch.no_grad():
            rows = []
            for _, block, moe in self.blocks:
                local = _local(moe.tokens_per_expert_E).float()
                rows.append(local / 2 if _recomputed(block) else local)
            counts = torch.stack(rows)  # a copy: the buffers may be zeroed now
            for _, _, moe in self.blocks:
                if moe.load_balance_coeff is None:  # else torchtitan's hook zeroes after reading
                    moe.tokens_per_expert_E.zero_()
            self._reduce(counts)
            self.window += counts
            idle = counts == 0
            self.idle = (self.idle + 1) * idle
            self.warned &= idle  # a streak that ended may warn again when a new one is long

    def _reduce(self, counts: torch.Tensor) -> None:
        dims = self.parallel_dims
        if dims is None or not dist.is_initialized():
            return
        if dims.ep_enabled and dims.tp > 1:  # as torchtitan's hook: EP+TP counts are per TP rank
            dist.all_reduce(counts, group=dims.get_mesh("tp").get_group())
        loss_mesh = dims.get_optional_mesh("loss")  # dp and cp: the ranks with different tokens
        if loss_mesh is not None:
            dist.all_reduce(counts, group=loss_mesh.get_group(), op=dist.ReduceOp.SUM)

    def log(self, step: int) -> dict[str, float]:
        """The ``moe/*`` figures since the previous log step (an extra source of the metrics
        processor, called at log steps on every rank); warns of idle experts; writes the totals."""
        window = self._drain(step)
        self._warn_idle()
        self.write(step)
        return expert_figures.figures(window)

    def _drain(self, step: int) -> torch.Tensor:
        window = self.window.to("cpu", torch.float64)
        self.window.zero_()
        self.totals += window
        self.last_step = step
        return window

    def _warn_idle(self) -> None:
        if self.idle_warn_steps <= 0:
            return
        new = (self.idle >= self.idle_warn_steps) & ~self.warned
        self.warned |= new
        if not self.writer:
            return
        idle = self.idle.cpu()
        for row, expert in new.nonzero().tolist():
            logger.warning(
                f"expert load: layer {self.layers[row]} expert {expert} received no tokens in the last"
                f" {int(idle[row, expert])} steps (tracking.expert_idle_warn_steps={self.idle_warn_steps})"
            )

    def write(self, step: int) -> None:
        """``expert_load.json`` in the run directory (the writing rank only)."""
        if not self.writer or self.first_step is None:
            return
        data = expert_figures.record(self.totals, self.layers, self.top_k, self.first_step, step)
        expert_figures.write_record(self.run_dir, data)

    def finish(self, step: int) -> None:
        """After the last step: the steps since the last log step join the totals."""
        if step > self.last_step:
            self._drain(step)
        self.write(step)


class ExpertLoad:
    """Mixin for a torchtitan ``Trainer``: per-expert load figures of a MoE model."""

    _expert_load: LoadCounter | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        blocks = moe_blocks(self.model_parts)
        if not blocks:
            return
        from torchtitan.components.metrics import _get_metrics_rank

        dims = self.parallel_dims
        rank = dist.get_rank() if dist.is_initialized() else 0
        schedule = self.config.parallelism.pipeline_parallel_schedule
        counter = LoadCounter(
            blocks,
            dims,
            idle_warn_steps=self.config.expert_load.idle_warn_steps,
            run_dir=os.environ.get(RUN_DIR_ENV) or self.config.dump_folder,
            writer=rank == _get_metrics_rank(parallel_dims=dims, pp_schedule=schedule),
        )
        run_first(self.optimizers, lambda: counter.read(self.step))  # torchtitan counts from 1
        self.metrics_processor.extra_sources.append(counter.log)
        self._expert_load = counter

    def train(self):
        super().train()
        if self._expert_load is not None:
            self._expert_load.finish(self.step)
