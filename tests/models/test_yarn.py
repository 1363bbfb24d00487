"""YaRN on model=native and model=nki_moe against Transformers 5's Qwen3 rotary embedding (the
oracle): the cos/sin table, and q/k rotated, in float32 at positions up to 131,072."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb

from qwen3_trainium.config.rope import Rope
from qwen3_trainium.models import yarn
from qwen3_trainium.models.kernels import rope as rope_ops
from qwen3_trainium.models.overrides.nki import NkiRoPE, rope_hf

LENGTH = 131072
HEAD_DIM, THETA = 128, 1e6
QWEN_YARN = Rope("yarn", LENGTH, factor=4.0, original_max_position_embeddings=32768)
# Every 1021st position and the last 128: a cheap subset of the 131,072 rows, tail included
# (256 rows: rope_hf needs a multiple of 128 x LNC)
POSITIONS = torch.cat([torch.arange(0, LENGTH, 1021)[:128], torch.arange(LENGTH - 128, LENGTH)])


@pytest.fixture(scope="module")
def hf_cos_sin():
    parameters = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    cfg = Qwen3Config(
        hidden_size=4096, num_attention_heads=32, head_dim=HEAD_DIM, max_position_embeddings=LENGTH,
        rope_parameters={**parameters, "rope_theta": THETA},
    )  # fmt: skip
    x = torch.zeros(1, 1, HEAD_DIM, dtype=torch.float32)
    cos, sin = Qwen3RotaryEmbedding(cfg)(x, POSITIONS[None])
    return cos[0], sin[0]


def _ours(rope: Rope = QWEN_YARN):
    base = yarn.CosSinRoPE.Config(dim=HEAD_DIM, max_seq_len=40960, theta=THETA)
    return yarn.rope_config(base, rope).build()


@pytest.fixture(scope="module")
def ours():
    return _ours()


def test_yarn_cos_sin_match_transformers_at_positions_up_to_131072(hf_cos_sin, ours):
    cos, sin = hf_cos_sin
    table = ours.cache[POSITIONS]
    assert table.shape == (POSITIONS.numel(), 2 * HEAD_DIM) and ours.cache.shape[0] == LENGTH
    cos_diff = (table[:, :HEAD_DIM] - cos).abs().max().item()
    sin_diff = (table[:, HEAD_DIM:] - sin).abs().max().item()
    print(f"YaRN cos/sin vs Transformers: max abs diff cos {cos_diff:.3e}, sin {sin_diff:.3e}")
    assert cos_diff <= 1e-6 and sin_diff <= 1e-6
    assert cos.abs().max() > 1.1  # the oracle carries the attention factor 0.1 ln 4 + 1 = 1.1386


def test_yarn_rotated_q_k_match_transformers_apply_rotary_pos_emb(hf_cos_sin, ours):
    cos, sin = hf_cos_sin
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, POSITIONS.numel(), 4, HEAD_DIM, generator=gen)
    k = torch.randn(1, POSITIONS.numel(), 2, HEAD_DIM, generator=gen)
    # HF's layout is [B, H, S, D]; ours (torchtitan's) [B, S, H, D]
    hq, hk = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos[None], sin[None])
    tq, tk = ours(q, k, POSITIONS[None])
    diffs = [(tq - hq.transpose(1, 2)).abs().max().item(), (tk - hk.transpose(1, 2)).abs().max().item()]
    print(f"YaRN q, k rotated (model RoPE) vs Transformers: max abs diff {max(diffs):.3e}")
    assert max(diffs) <= 1e-6


def test_rope_hf_reference_and_nki_module_carry_the_same_yarn_table(hf_cos_sin, ours):
    cos, sin = hf_cos_sin
    nki_config = rope_hf(
        yarn.rope_config(yarn.CosSinRoPE.Config(dim=HEAD_DIM, max_seq_len=8, theta=THETA), QWEN_YARN)
    )
    assert type(nki_config) is NkiRoPE.Config and nki_config.attention_factor == pytest.approx(1.1386294361)
    nki = nki_config.build()
    assert torch.equal(nki.cache, ours.cache)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, POSITIONS.numel(), 4, HEAD_DIM, generator=gen)
    k = torch.randn(1, POSITIONS.numel(), 2, HEAD_DIM, generator=gen)
    cache = rope_ops.gathered_cache(nki.cache, q.shape[1], POSITIONS[None])
    rq, rk = rope_ops.rope_reference(q, k, cache)
    hq, hk = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos[None], sin[None])
    assert (rq - hq.transpose(1, 2)).abs().max() <= 1e-6 and (rk - hk.transpose(1, 2)).abs().max() <= 1e-6
    nq, nk = nki(q, k, POSITIONS[None])
    assert torch.equal(nq, rq) and torch.equal(nk, rk)


def test_yarn_survives_torchtitans_resize_to_training_seq_len(ours):
    """Decoder.update_from_config replaces each rope config with max_seq_len=seq_len."""
    resized = dataclasses.replace(ours.config, max_seq_len=8192).build()
    assert type(resized) is yarn.YarnRoPE and resized.config.attention_factor == ours.config.attention_factor
    assert torch.equal(resized.cache, ours.cache[:8192])


def test_default_rope_keeps_torchtitans_class_and_only_the_table_size():
    rope = _ours(Rope("default", 40960))
    assert type(rope) is yarn.CosSinRoPE and rope.cache.shape == (40960, 2 * HEAD_DIM)
