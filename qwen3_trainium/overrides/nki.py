"""``@override`` factories that swap the NKI kernels into torchtitan's Qwen3 (per node).

- ``rope_hf``: every ``CosSinRoPE`` node -> ``NkiRoPE`` (still a ``CosSinRoPE``, so torchtitan's
  HF state-dict adapter and its RoPE checks keep working), which rotates q and k with the
  ``qwen3_trainium::rope_hf`` op.
- ``moe_experts``: every ``RoutedExperts`` node (dispatch + grouped experts + combine) ->
  ``BlockwiseRoutedExperts``, which keeps the same parameters (``inner_experts.w1_EFD`` ...,
  so checkpoints and sharding are unchanged) and computes with the
  ``qwen3_trainium::moe_blockwise`` op.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.tensor import DTensor
from torchtitan.config import derive, override
from torchtitan.models.common.moe import RoutedExperts
from torchtitan.models.common.rope import CosSinRoPE

from qwen3_trainium.kernels import moe as moe_ops
from qwen3_trainium.kernels import rope as rope_ops


class NkiRoPE(CosSinRoPE):
    @dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config):
        pass

    def forward(self, query, key, positions=None):
        cache = rope_ops.gathered_cache(self.cache, query.shape[1], positions)  # [B|1, S, 2D]
        return rope_ops.rope_hf(query, key, cache, False)


class BlockwiseRoutedExperts(RoutedExperts):
    @dataclass(kw_only=True, slots=True)
    class Config(RoutedExperts.Config):
        block_size: int = 256
        compute_dtype: str = "bfloat16"

    def __init__(self, config: Config):
        super().__init__(config)
        self.block_size = config.block_size
        self.compute_dtype = config.compute_dtype

    def forward(self, x_BLD, topk_scores_BLK, topk_expert_ids_BLK, num_local_tokens_per_expert_E):
        batch, seq, dim = x_BLD.shape
        top_k = topk_scores_BLK.shape[-1]
        experts = self.inner_experts
        weights = [
            w.to_local() if isinstance(w, DTensor) else w
            for w in (experts.w1_EFD, experts.w2_EDF, experts.w3_EFD)
        ]
        out_TD = moe_ops.routed_experts(
            x_BLD.reshape(-1, dim),
            topk_scores_BLK.reshape(-1, top_k),
            topk_expert_ids_BLK.reshape(-1, top_k),
            *weights,
            block_size=self.block_size,
            compute_dtype=self.compute_dtype,
        )
        return out_TD.view(batch, seq, dim)


@override(target=CosSinRoPE.Config, exact=True, description="NKI rope_hf kernel (reference off Neuron)")
def rope_hf(cfg: CosSinRoPE.Config) -> NkiRoPE.Config:
    return derive(cfg, NkiRoPE.Config)


@override(
    target=RoutedExperts.Config, exact=True, description="NKI blockwise MoE experts (reference off Neuron)"
)
def moe_experts(
    cfg: RoutedExperts.Config, block_size: int = 256, compute_dtype: str = "bfloat16"
) -> BlockwiseRoutedExperts.Config:
    return derive(cfg, BlockwiseRoutedExperts.Config, block_size=block_size, compute_dtype=compute_dtype)


__all__ = ["BlockwiseRoutedExperts", "NkiRoPE", "moe_experts", "rope_hf"]
