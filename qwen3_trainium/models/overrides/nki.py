"""``@override`` factories that swap the NKI kernels into torchtitan's Qwen3 (per node).

- ``rope_hf``: every ``CosSinRoPE`` node, YaRN's ``YarnRoPE`` included -> ``NkiRoPE`` (still a
  ``CosSinRoPE``, so torchtitan's HF state-dict adapter and its RoPE checks keep working), which
  rotates q and k with the ``qwen3_trainium::rope_hf`` op. Its cache is ``YarnRoPE``'s: the same
  cos/sin (times YaRN's attention factor, 1.0 without YaRN) the reference and the kernel read.
- ``moe_experts``: every ``RoutedExperts`` node (dispatch + grouped experts + combine) ->
  ``BlockwiseRoutedExperts``, which stores the experts in the kernels' layout
  (``inner_experts.gate_up_ED2F`` / ``down_EFD``, ``blockwise_experts.py``) and computes with the
  ``qwen3_trainium::moe_blockwise`` op.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.config import derive, override
from torchtitan.models.common.moe import RoutedExperts
from torchtitan.models.common.rope import CosSinRoPE

from qwen3_trainium.models.kernels import rope as rope_ops
from qwen3_trainium.models.overrides.blockwise_experts import BlockwiseRoutedExperts, fused_config
from qwen3_trainium.models.yarn import YarnRoPE

ROPE_SOURCES = (CosSinRoPE.Config, YarnRoPE.Config)  # the nodes rope_hf replaces


class NkiRoPE(YarnRoPE):
    @dataclass(kw_only=True, slots=True)
    class Config(YarnRoPE.Config):
        pass

    def forward(self, query, key, positions=None):
        cache = rope_ops.gathered_cache(self.cache, query.shape[1], positions)  # [B|1, S, 2D]
        return rope_ops.rope_hf(query, key, cache, False)


# Not exact: YarnRoPE.Config is a CosSinRoPE.Config subclass; derive copies its attention_factor.
@override(target=CosSinRoPE.Config, description="NKI rope_hf kernel (reference off Neuron)")
def rope_hf(cfg: CosSinRoPE.Config) -> NkiRoPE.Config:
    if type(cfg) not in ROPE_SOURCES:  # another CosSinRoPE: its cache is not known to be this one
        raise TypeError(
            f"rope_hf replaces {[c.__qualname__ for c in ROPE_SOURCES]}, not {type(cfg).__qualname__}"
        )
    return derive(cfg, NkiRoPE.Config)


@override(
    target=RoutedExperts.Config, exact=True, description="NKI blockwise MoE experts (reference off Neuron)"
)
def moe_experts(
    cfg: RoutedExperts.Config, block_size: int = 256, compute_dtype: str = "bfloat16"
) -> BlockwiseRoutedExperts.Config:
    return fused_config(cfg, block_size=block_size, compute_dtype=compute_dtype)


__all__ = ["BlockwiseRoutedExperts", "NkiRoPE", "moe_experts", "rope_hf"]
