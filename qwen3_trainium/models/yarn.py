"""YaRN on torchtitan's Qwen3 (``model=native``, ``model=nki_moe``): Hugging Face's rotary embedding.

torchtitan 0.3.0's ``CosSinRoPE`` with ``scaling="yarn"`` builds Transformers' YaRN ``inv_freq``
(``rope.py`` ``_yarn_inv_freq``; max abs difference 0.0 on Qwen3's 128 dims, factor 4, original
32768: tests/models/test_yarn.py) but leaves out the attention factor, which its docstring says the
model folds into its softmax scale; torchtitan's Qwen3 does not (``models/common/attention.py:976``,
``head_dim**-0.5``). Transformers multiplies cos and sin by it (``modeling_qwen3.py``
``Qwen3RotaryEmbedding.forward``: ``cos = emb.cos() * self.attention_scaling``), so ``YarnRoPE``
multiplies its cache the same way and the softmax scale stays ``head_dim**-0.5``.

The cache is per attention layer (torchtitan builds one RoPE module per ``GQAttention``), sized
to ``training.seq_len``: ``Decoder.update_from_config`` replaces each layer's rope config with
``dataclasses.replace(rope, max_seq_len=seq_len)`` (``decoder.py:176-181``), which keeps this
class and its ``attention_factor``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torchtitan.models.common.rope import CosSinRoPE

from qwen3_trainium.config.rope import Rope


class YarnRoPE(CosSinRoPE):
    @dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config):
        attention_factor: float = 1.0  # HF's attention_scaling, applied to cos and sin

    def _precompute_cache(self) -> torch.Tensor:
        return CosSinRoPE._precompute_cache(self) * self.config.attention_factor


def rope_config(base: CosSinRoPE.Config, rope: Rope) -> CosSinRoPE.Config:
    """``base`` (a flavor's rope) with the run's table size and, for yarn, its scaling."""
    if not rope.yarn:
        return dataclasses.replace(base, max_seq_len=rope.max_position_embeddings)
    return YarnRoPE.Config(
        dim=base.dim,
        max_seq_len=rope.max_position_embeddings,
        theta=base.theta,
        scaling="yarn",
        rope_factor=float(rope.factor),
        original_seq_len=int(rope.original_max_position_embeddings),
        # Transformers: `get("beta_fast") or 32`, `get("beta_slow") or 1` (modeling_rope_utils.py:444-445)
        beta_fast=float(rope.beta_fast or 32.0),
        beta_slow=float(rope.beta_slow or 1.0),
        truncate=True if rope.truncate is None else bool(rope.truncate),
        attention_factor=rope.scale(),
    )


def apply(model_config, rope: Rope) -> None:
    """Every attention layer of a torchtitan decoder config gets the run's RoPE."""
    for layer in model_config.layers:
        attention = getattr(layer, "attention", None)
        if attention is not None and getattr(attention, "rope", None) is not None:
            attention.rope = rope_config(attention.rope, rope)
