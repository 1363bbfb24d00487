"""Expert LoRA (``expert_lora.py``) on ``model=nki_moe``'s blockwise op: merged weights, not saved.

The kernel (``kernels/moe.py``, nki-library's ``moe_cte``) applies SiLU inside, between the gate/up
and the down projection, so the gate/up delta cannot be added to its output: it takes merged
weights ``W + s * B @ A`` (PEFT computes the same way, merging per forward). The op saves its
weight inputs for backward, and saving the merged copy would keep one full copy of every layer's
experts alive until that layer's backward (the cost ``FusedExperts`` exists to avoid: 105 GiB a
rank on 30B-A3B, ``overrides/blockwise_experts.py``). A ``saved_tensors_hooks`` pair stores the
recipe (the frozen base, the adapters) instead and merges again when backward reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qwen3_trainium.models.expert_lora_parts import ADAPTER_PARAMS
from qwen3_trainium.models.expert_lora_parts import local as _local
from qwen3_trainium.models.overrides.blockwise_experts import BlockwiseRoutedExperts


def fused_deltas(experts, a_gate_up, b_gate_up, a_down, b_down):
    """The adapters' deltas in the fused layout: gate_up ``[E, D, 2, F]`` (``[..., 0, :]`` gate)
    and down ``[E, F, D]``, each scaled; None for a part not adapted."""
    s = experts._lora_scaling
    gate_up = down = None
    if a_gate_up is not None:
        e, _, d = a_gate_up.shape
        gate_up = s * torch.einsum("eor,erd->edo", b_gate_up, a_gate_up).reshape(e, d, 2, -1)
    if a_down is not None:
        down = s * torch.einsum("edr,erf->efd", b_down, a_down)
    return gate_up, down


class LoRABlockwiseRoutedExperts(BlockwiseRoutedExperts):
    """``BlockwiseRoutedExperts`` on merged weights, ``W + s * B @ A`` per expert, with the merged
    copies recomputed in backward instead of saved (``_RecomputeMerged``)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BlockwiseRoutedExperts.Config):
        pass

    def forward(self, x_BLD, topk_scores_BLK, topk_expert_ids_BLK, num_local_tokens_per_expert_E):
        experts = self.inner_experts
        names = [getattr(experts, n, None) for n in ADAPTER_PARAMS]
        adapters = [None if p is None else _local(p) for p in names]
        bases = (_local(experts.gate_up_ED2F), _local(experts.down_EFD))
        deltas = fused_deltas(experts, *adapters)
        merged = tuple(w if d is None else w + d.to(w.dtype) for w, d in zip(bases, deltas, strict=True))
        with _RecomputeMerged(experts, bases, adapters, merged):
            return _blockwise(self, x_BLD, topk_scores_BLK, topk_expert_ids_BLK, merged)


def _blockwise(routed, x_BLD, topk_scores_BLK, topk_expert_ids_BLK, weights):
    from qwen3_trainium.models.kernels import moe as moe_ops

    batch, seq, dim = x_BLD.shape
    top_k = topk_scores_BLK.shape[-1]
    out_TD = moe_ops.routed_experts(
        x_BLD.reshape(-1, dim),
        topk_scores_BLK.reshape(-1, top_k),
        topk_expert_ids_BLK.reshape(-1, top_k),
        *weights,
        block_size=routed.block_size,
        compute_dtype=routed.compute_dtype,
    )
    return out_TD.view(batch, seq, dim)


class _RecomputeMerged(torch.autograd.graph.saved_tensors_hooks):
    """Within: a merged weight that autograd saves for backward is stored as the recipe (the
    frozen base, the adapters) and merged again when backward unpacks it. Every other saved tensor
    goes to the hooks that were in force outside (activation checkpointing's, which drop it and
    recompute the layer), or is kept as usual when there are none: the innermost hooks receive
    every tensor saved within, so keeping them here would undo the checkpoint (108 GiB a rank on
    30B-A3B, traced). The merge reads the base and adapters, which FSDP gathers again for the
    layer's backward as it does for the base weights the op saves without LoRA."""

    def __init__(self, experts, bases, adapters, merged):
        keys = {_key(m): i for i, (m, w) in enumerate(zip(merged, bases, strict=True)) if m is not w}
        # the hooks in force now, which this context shadows once entered (torch.utils.checkpoint
        # reads the same: _current_user_saved_tensors_hooks)
        outer = torch._C._autograd._top_saved_tensors_default_hooks(False)

        def pack(t):
            index = keys.get(_key(t))
            if index is not None:
                return _Recipe(index)
            return _Outer(outer[0](t)) if outer is not None else t

        def unpack(packed):
            if isinstance(packed, _Recipe):
                with torch.no_grad():
                    deltas = fused_deltas(experts, *(None if a is None else a.detach() for a in adapters))
                    base = bases[packed.index]
                    return base + deltas[packed.index].to(base.dtype)
            if isinstance(packed, _Outer):
                return outer[1](packed.value)
            return packed

        super().__init__(pack, unpack)


@dataclass(frozen=True, slots=True)
class _Recipe:
    index: int  # which merged weight: 0 gate_up, 1 down


@dataclass(frozen=True, slots=True)
class _Outer:
    value: object  # what the outer hooks' pack returned


def _key(t: torch.Tensor):
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
