"""The trainer side of ``objective=dpo`` (docs/dpo.md): TRL 1.16.0's DPO loss on packed
preference rows, with torchtitan's loop (clipping, optimizer, checkpoints, logging) untouched.
With ``config.dpo.enable`` False, as for every other objective, it changes nothing.

A row holds whole pairs, chosen then rejected (``data/preference``): ``SEGMENT_KEY`` names each
label position's side (2j chosen, 2j + 1 rejected of the row's j-th pair, -1 elsewhere) and
``PAIR_KEY`` each pair's record index (-1 past the last).

The step (``_forward_backward_body``): one decoder forward; pass 1 applies the lm_head chunk by
chunk without a gradient and sums each side's float32 completion log-probs (``dpo_logps``); the
reference sums come from the precomputed table (``rank/dpo_reference.py``) or, with LoRA, from a
no-grad forward of the same model in eval mode with its adapters switched off (no copy, no extra
parameter); the loss ``L = sum of the pairs' losses / the step's pairs over all ranks and
micro-batches`` is taken on detached leaf sums, ``w = -dL/dsums``; pass 2 is torchtitan's
``ChunkedLossWrapper`` with ``DPOTokenLoss``, ``-sum_t w[side(t)] log p_t``, whose backward gives
exactly dL/dtheta (chain rule). torchtitan sums gradients over micro-batches and data-parallel
ranks (FSDP's division is off), and logs ``global_avg_loss`` as the sum of what each
(rank, micro-batch) returns: each returns its share, so the log is the step's mean DPO loss.

TRL takes a mean of per-micro-batch pair means (``loss_is_scaled_for_ga = False``); ours is the
mean over the step's pairs, the same when every micro-batch holds as many pairs (TRL's parity test
here: one micro-batch). Not here: context, tensor and pipeline parallel (refused at build).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from qwen3_trainium.rank import dpo_logps
from qwen3_trainium.rank.dpo_loss import (
    LossParams,
    PairSums,
    loss_and_side_weights,
    metric_means,
    metric_sums,
)


def loss_params(dpo) -> LossParams:
    """The loss's parameters from the trainer's ``DPOSettings``."""
    return LossParams(beta=dpo.beta, label_smoothing=dpo.label_smoothing, discopop_tau=dpo.discopop_tau)


def forward_backward(model, loss_fn, batch, rows, reference, dpo, global_pairs):
    """One micro-batch's DPO forward and backward: ``batch`` = (inputs, labels, extra_kwargs) as
    post_dataloading_process gives them, ``rows`` = (segment [B, L], pairs [B, P]), ``reference``
    [B, 2P] sums, ``dpo`` the ``DPOSettings``, ``global_pairs`` the step's pair count. The model
    returns hidden states (``_skip_lm_head``); ``loss_fn`` is a ChunkedLossWrapper around
    DPOTokenLoss with its lm_head set. Returns (this micro-batch's share of the step's loss,
    detached; its dpo_loss.metric_sums)."""
    (inputs, labels, extra_kwargs), (segment, pairs) = batch, rows
    pred = model(inputs, **extra_kwargs)
    policy = dpo_logps.side_sums(loss_fn, pred, labels, segment, 2 * pairs.shape[1])
    counts = dpo_logps.side_counts(segment, policy.shape[1])
    valid = pairs >= 0
    loss, side_weights = loss_and_side_weights(
        policy, reference, counts, valid, loss_params(dpo), dpo.loss_types, dpo.loss_weights, global_pairs
    )
    totals = metric_sums(PairSums.from_sides(policy, reference, counts), valid, dpo.beta)
    surrogate, _ = loss_fn(pred, labels, None, weights=dpo_logps.token_weights(side_weights, segment))
    del pred
    surrogate.backward()  # through the chunks' lm_head, then the decoder (ChunkedLossWrapper)
    return loss, totals


class DPOObjective:
    """Mixin for a torchtitan ``Trainer``: the DPO step (``config.dpo``)."""

    _dpo_reference = None  # rank/dpo_reference.py's ReferenceTable (reference=precompute)
    _dpo_rows: tuple | None = None  # (segment, pairs) of the batch post_dataloading_process read
    _dpo_global_pairs: torch.Tensor | None = None
    _dpo_totals: torch.Tensor | None = None  # dpo_loss.metric_sums over the step's micro-batches

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        if not config.dpo.enable:
            return
        self._dpo_refuse_layouts()
        self._dpo_totals = torch.zeros(7, dtype=torch.float64, device=self.device)
        self.metrics_processor.extra_sources.append(self._dpo_metrics)

    def _dpo_refuse_layouts(self) -> None:
        """What pre-flight refuses for objective=dpo, held here too (a traceback, not a silently
        wrong gradient, if a config slips past): only the chunked loss has the lm_head the passes
        need, and the sums are not reduced over context or tensor parallel ranks."""
        from torchtitan.components.loss import ChunkedLossWrapper

        dims = self.parallel_dims
        layouts = {"context parallel": dims.cp_enabled, "tensor parallel": dims.tp_enabled}
        why = [name for name, on in {**layouts, "pipeline parallel": dims.pp_enabled}.items() if on]
        if not isinstance(self.loss_fn, ChunkedLossWrapper):
            why.append("model=hf (no chunked loss)")
        if self.config.dpo.reference == "adapters_off" and not dpo_logps.lora_modules(self.model_parts[0]):
            why.append("reference=adapters_off without LoRA adapters")
        if why:
            raise RuntimeError(f"objective=dpo does not support: {', '.join(why)}")

    def should_continue_training(self) -> bool:
        """At the first step boundary (after the checkpoint load, torchtitan's ``train``), on every
        rank: the reference tables (training's, and eval=on's held-out one) for reference=precompute."""
        if not super().should_continue_training():
            return False
        dpo = self.config.dpo
        if dpo.enable and dpo.reference == "precompute" and self._dpo_reference is None:
            from qwen3_trainium.rank import dpo_reference, dpo_validator

            self._dpo_reference = dpo_reference.prepare(self, "train")
            dpo_validator.bind(self)  # eval=on: the held-out table, from the same starting weights
        return True

    def train_step(self, data_iterator):
        """The step's micro-batches read first (as torchtitan's ``train_step`` does) to count its
        pairs over the batch mesh: the loss's divisor."""
        if not self.config.dpo.enable:
            return super().train_step(data_iterator)
        from qwen3_trainium.data.preference import PAIR_KEY

        count = self.gradient_accumulation_steps * self.num_pipeline_parallel_microbatches
        batches = [next(data_iterator) for _ in range(count)]
        local = sum((inputs[PAIR_KEY] >= 0).sum() for inputs, _ in batches).to(self.device, torch.float32)
        if self.parallel_dims.dp_enabled:
            from torchtitan.distributed.utils import dist_sum_tensor

            local = dist_sum_tensor(local, self.parallel_dims.get_mesh("batch"))
        self._dpo_global_pairs = local.clamp(min=1.0)
        self._dpo_totals.zero_()
        return super().train_step(iter(batches))

    def post_dataloading_process(self, input_dict, labels):
        """The DPO keys out of the batch (torchtitan would hand them to the model as keywords),
        kept for the body."""
        if not self.config.dpo.enable:
            return super().post_dataloading_process(input_dict, labels)
        from qwen3_trainium.data.preference import PAIR_KEY, SEGMENT_KEY

        segment, pairs = input_dict.pop(SEGMENT_KEY), input_dict.pop(PAIR_KEY)
        inputs, labels, extra_kwargs = super().post_dataloading_process(input_dict, labels)
        self._dpo_rows = (segment.to(inputs.device), pairs.to(inputs.device))
        return inputs, labels, extra_kwargs

    def _forward_backward_body(self, inputs, labels, global_valid_tokens, extra_kwargs):
        if not self.config.dpo.enable:
            return super()._forward_backward_body(inputs, labels, global_valid_tokens, extra_kwargs)
        segment, pairs = self._dpo_rows
        model = self.model_parts[0]
        with self.train_context():
            if self.config.dpo.reference == "precompute":
                reference = self._dpo_reference.lookup(pairs).to(device=inputs.device, dtype=torch.float32)
            else:  # adapters_off
                reference = dpo_logps.reference_sums(
                    model, self.loss_fn, inputs, labels, extra_kwargs, segment, pairs
                )
            loss, totals = forward_backward(
                model,
                self.loss_fn,
                (inputs, labels, extra_kwargs),
                (segment, pairs),
                reference,
                self.config.dpo,
                self._dpo_global_pairs,
            )
        self._dpo_totals += totals
        return loss

    def dpo_side_sums(self, input_dict, labels) -> torch.Tensor:
        """float32 [B, 2 * max_pairs]: the policy's per-side completion log-prob sums of a batch as
        the loader yields it, no grad, in the model's current mode (callers set eval)."""
        batch = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in input_dict.items()}
        seen = self.ntokens_seen  # post_dataloading_process counts the tokens as trained
        inputs, labels, extra_kwargs = self.post_dataloading_process(batch, labels.to(self.device))
        self.ntokens_seen = seen
        segment, pairs = self._dpo_rows
        with torch.no_grad(), self.train_context():
            hidden = self.model_parts[0](inputs, **extra_kwargs)
            return dpo_logps.side_sums(self.loss_fn, hidden, labels, segment, 2 * pairs.shape[1])

    def _dpo_metrics(self, step) -> dict:
        """TRL's reward and log-prob means over the step's pairs, all ranks (a collective: every
        rank runs it). Tensor or context parallel ranks would add their group's sums and counts
        alike, which leaves the means unchanged."""
        totals = self._dpo_totals.clone()
        if dist.is_initialized():
            dist.all_reduce(totals)
        return metric_means(totals.cpu())
