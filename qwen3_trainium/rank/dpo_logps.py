"""Per-side completion log-prob sums for ``objective=dpo`` (``rank/dpo.py``): the policy's, from
the decoder's hidden states without a gradient, and the reference's when it is the same LoRA
model with its adapters switched off.

The model runs with ``_skip_lm_head`` (torchtitan's ``Trainer`` sets it with
``ChunkedLossWrapper``, ``torchtitan/trainer.py``), so it returns the final norm's hidden states
and the lm_head is applied here chunk by chunk, as the wrapper does, so that the full [B, L, V]
logits never exist. The log-probs are torchtitan's ``compute_logprobs`` (float32 whatever the
model computes in, 0 at label -100), summed per side by ``dpo_loss.segment_sums``: TRL 1.16.0
sums its float32 per-token log-probs over the completion the same way
(``trl/trainer/dpo_trainer.py:1304``).
"""

from __future__ import annotations

import contextlib

import torch
from torchtitan.components.loss import compute_logprobs

from qwen3_trainium.rank.dpo_loss import segment_sums


def side_sums(
    loss_fn, hidden: torch.Tensor, labels: torch.Tensor, segment: torch.Tensor, n: int
) -> torch.Tensor:
    """float32 [B, n]: each side's summed completion log-prob, no gradient. ``hidden`` [B, L, D]
    (detached here), ``labels`` and ``segment`` [B, L]; ``loss_fn`` the run's ChunkedLossWrapper:
    its lm_head, in as many sequence chunks."""
    from torch.distributed._composable.fsdp import FSDPModule

    lm_head, num_chunks = loss_fn.lm_head, loss_fn.num_chunks
    fsdp = isinstance(lm_head, FSDPModule)
    if fsdp:  # one all-gather for all chunks, as ChunkedLossWrapper keeps the weight unsharded
        lm_head.set_reshard_after_forward(False)
    try:
        with torch.no_grad():
            chunks = zip(
                hidden.detach().chunk(num_chunks, dim=1),
                labels.chunk(num_chunks, dim=1),
                segment.chunk(num_chunks, dim=1),
                strict=True,
            )
            sums = hidden.new_zeros(hidden.shape[0], n, dtype=torch.float32)
            for h, target, side in chunks:
                sums = sums + segment_sums(compute_logprobs(lm_head(h), target), side, n)
            return sums
    finally:
        if fsdp:
            lm_head.set_reshard_after_forward(True)
            lm_head.reshard()


def side_counts(segment: torch.Tensor, n: int) -> torch.Tensor:
    """float32 [B, n]: each side's completion token count (ipo's and sigmoid_norm's divisor)."""
    return segment_sums(torch.ones_like(segment, dtype=torch.float32), segment, n)


def token_weights(side_weights: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
    """[B, L]: each position's side's weight, 0 where the position belongs to no side."""
    gathered = torch.gather(side_weights, 1, segment.clamp(min=0).long())
    return torch.where(segment >= 0, gathered, torch.zeros_like(gathered))


def lora_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every module that scales an adapter's output: torchtitan's ``LoRALinear``
    (``base_out + self._lora_scaling * lora_b(lora_a(x))``, torchtitan/components/lora.py) and the
    expert adapters (``models/expert_lora.py``, whose fused route merges ``W + s * delta``)."""
    return [m for m in model.modules() if hasattr(m, "_lora_scaling")]


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module):
    """The base model: every adapter's scale 0.0 within, restored on exit (also on error).
    ``base + 0.0 * lora(x)`` is ``base`` for finite values: TRL's PEFT reference, the model with
    its adapters disabled (``use_adapter(model, None)``, dpo_trainer.py:1327-1336)."""
    modules = lora_modules(model)
    saved = [m._lora_scaling for m in modules]
    try:
        for module in modules:
            module._lora_scaling = 0.0
        yield model
    finally:
        for module, scale in zip(modules, saved, strict=True):
            module._lora_scaling = scale


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """``model.eval()`` within, the previous mode restored: a MoE router counts its tokens per
    expert only in training mode (torchtitan/models/common/moe.py ``if self.training``), and the
    balance ledgers record only in training mode with grad (models/moe_balance.py
    ``BalancedRouter.forward``), so a reference forward in here feeds neither."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def reference_sums(model, loss_fn, inputs, labels, extra_kwargs, segment, pairs) -> torch.Tensor:
    """float32 [B, 2P]: the LoRA model's base (adapters off), no grad, in eval mode: its side sums."""
    with torch.no_grad(), eval_mode(model), adapters_off(model):
        hidden = model(inputs, **extra_kwargs)
        return side_sums(loss_fn, hidden, labels, segment, 2 * pairs.shape[1])
