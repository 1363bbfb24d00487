"""The trainer side of ``model.moe_balance`` (docs/moe.md): Hugging Face's router
load-balancing loss and the router z-loss, weighted per data-parallel rank and micro-batch.

The losses themselves live in the model (``models/moe_balance.py``): each micro-batch's forward
pools its routers' sums, and its backward adds ``weight * grad(loss)`` to the router. The weight
is ``coef / (dp * ga)``: torchtitan SUMS gradients over the data-parallel ranks (FSDP's gradient
division is off, ``torchtitan/distributed/fsdp.py`` ``disable_fsdp_gradient_division``) and over
the ``ga`` micro-batches of a step, so each (rank, micro-batch) enters as its share of the mean:
the step's loss is the mean over them of Transformers' per-batch loss, what a Transformers model
gives on each device batch, without huggingface/transformers#48690's world-size factor. Context
parallel ranks split one micro-batch's sequences: their sums are added before the product
(``Ledger.group``), and their weight is not divided again (dp counts batch shards, not cp).

The padding mask comes from the chat loader (``data/chat/loader.py``, key ``MASK_KEY``): it is
taken out of the batch here before torchtitan would pass it to the model as a keyword, and
sharded as the tokens are under context parallel. Text rows have no padding in training.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from qwen3_trainium.config.choices import MoEBalance as Mode
from qwen3_trainium.config.schema import ModelPath, RunConf

# pre-flight reads the resolution below without torch: torch, torchtitan and the loader load lazily

HF_DEFAULT_AUX_COEF = 0.001  # transformers configuration_qwen3_moe.py: router_aux_loss_coef


@dataclass(kw_only=True, slots=True)
class BalanceConfig:
    """The auxiliary router losses a MoE run adds (0: none)."""

    aux_loss_coef: float = 0.0
    z_loss_coef: float = 0.0


def mode(run: RunConf, moe: bool) -> Mode:
    """``model.moe_balance`` resolved: auto is aux_loss for HF weights (Transformers' own
    training objective; the HF model has no router bias to keep), bias otherwise (torchtitan's
    default), none on a dense model and for model=hf (Transformers' model as configured)."""
    from qwen3_trainium.config.runconfig import hf_checkpoint

    chosen = run.model.moe_balance
    if not moe or (run.model.path is ModelPath.hf and chosen is Mode.auto):
        return Mode.none
    if chosen is Mode.auto:
        return Mode.aux_loss if hf_checkpoint(run) else Mode.bias
    return chosen


def checkpoint_aux_coef(run: RunConf) -> float | None:
    """The source HF checkpoint's ``router_aux_loss_coef`` (None: no such checkpoint or key)."""
    ckpt = run.checkpoint
    path = ckpt.initial_load_path if ckpt.initial_load_in_hf else ""
    config = os.path.join(path, "config.json") if path else ""
    if not config or not os.path.isfile(config):
        return None
    with open(config) as f:
        return json.load(f).get("router_aux_loss_coef")


def balance_config(run: RunConf, moe: bool) -> BalanceConfig:
    """The coefficients the trainer applies (0: that loss is off)."""
    if mode(run, moe) is not Mode.aux_loss:
        return BalanceConfig(z_loss_coef=run.model.moe_z_loss_coef if moe else 0.0)
    coef = run.model.moe_aux_loss_coef
    if coef is None:
        coef = checkpoint_aux_coef(run)
    return BalanceConfig(
        aux_loss_coef=HF_DEFAULT_AUX_COEF if coef is None else float(coef),
        z_loss_coef=run.model.moe_z_loss_coef,
    )


class MoEBalance:
    """Mixin for a torchtitan ``Trainer``: the router's auxiliary losses (``config.moe_balance``)."""

    _balance_ledgers: list = []

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        balance = config.moe_balance
        self._balance_ledgers = []
        if not (balance.aux_loss_coef or balance.z_loss_coef):
            return
        from qwen3_trainium.models.moe_balance import install

        dims = self.parallel_dims
        # Each (DP rank, micro-batch) adds its share of the mean, and torchtitan sums gradients
        # over both. Under tensor parallel every TP rank's router sees all of its batch's tokens
        # (the sequence is gathered before the MoE layer: the counts need no TP reduction) and
        # the replicated router's gradient is summed over TP, so each TP rank adds 1/tp of it
        # (measured: exactly 2x the 1-rank gradient at TP 2 without this factor).
        shares = dims.dp_replicate * dims.dp_shard * dims.tp * self.gradient_accumulation_steps
        group = dims.get_mesh("cp").get_group() if dims.cp_enabled else None
        for part in self.model_parts:
            ledger = install(part, balance.aux_loss_coef / shares, balance.z_loss_coef / shares, group)
            if ledger is not None:
                self._balance_ledgers.append(ledger)
        if self._balance_ledgers:
            self.metrics_processor.extra_sources.append(self._balance_metrics)

    def post_dataloading_process(self, input_dict, labels):
        from qwen3_trainium.data.chat.loader import MASK_KEY

        mask = input_dict.pop(MASK_KEY, None)
        inputs, labels, extra_kwargs = super().post_dataloading_process(input_dict, labels)
        if self._balance_ledgers:
            mask = self._local_mask(mask, inputs)
            for ledger in self._balance_ledgers:
                ledger.begin(mask)
        return inputs, labels, extra_kwargs

    def _local_mask(self, mask, inputs):
        """This rank's tokens of the mask: sharded as torchtitan shards the inputs under CP."""
        if mask is None:
            return None
        mask = mask.to(inputs.device)
        if self.parallel_dims.cp_enabled:
            from torchtitan.distributed.context_parallel.api import cp_shard

            balancer = self.config.parallelism.context_parallel_load_balancer
            (mask,), _ = cp_shard(self.parallel_dims.get_mesh("cp"), (mask,), None, balancer)
        if mask.shape != inputs.shape:
            raise RuntimeError(f"balance mask {tuple(mask.shape)} vs inputs {tuple(inputs.shape)}")
        return mask

    def train_step(self, *args, **kwargs):
        for ledger in self._balance_ledgers:
            ledger.history.clear()
        return super().train_step(*args, **kwargs)

    def _balance_metrics(self, step) -> dict:
        """The step's unscaled losses (Transformers' ``outputs.aux_loss`` meaning): the mean over
        its micro-batches and ranks (cp/tp ranks hold their group's value, so a world mean is
        the data-parallel mean). A collective: every rank runs it."""
        import torch
        import torch.distributed as dist

        history = [entry for ledger in self._balance_ledgers for entry in ledger.history]
        totals = [sum(a for a, _ in history), sum(z for _, z in history), len(history)]
        sums = torch.tensor(totals, dtype=torch.float64)
        if dist.is_initialized():
            sums = sums.to(self.device)
            dist.all_reduce(sums)
        aux, z, n = sums.tolist()
        n = max(n, 1.0)
        out = {"moe/z_loss": z / n} if self.config.moe_balance.z_loss_coef else {}
        if self.config.moe_balance.aux_loss_coef:
            out["moe/aux_loss"] = aux / n
        return out
