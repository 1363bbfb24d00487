"""rope_hf: exact parity with torchtitan's CosSinRoPE, the custom op, the rule, the Neuron wrapper."""

from __future__ import annotations

import pytest
import torch
from torchtitan.models.common.rope import CosSinRoPE

from qwen3_trainium.kernels import rope
from qwen3_trainium.overrides.nki import NkiRoPE

SHAPES = [  # (B, S, Hq, Hk, D)
    (1, 256, 4, 2, 64),  # GQA
    (2, 256, 8, 8, 128),
    (2, 512, 16, 4, 128),  # GQA 4:1, two 256-row tiles
    (3, 256, 2, 1, 32),
]


def _titan_rope(dim: int, max_seq_len: int = 4096) -> CosSinRoPE:
    return CosSinRoPE(CosSinRoPE.Config(dim=dim, max_seq_len=max_seq_len, theta=1e6))


def _inputs(b, s, hq, hk, d, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, hq, d, generator=gen, dtype=dtype)
    k = torch.randn(b, s, hk, d, generator=gen, dtype=dtype)
    # per-document positions (reset at document starts), different per batch row
    positions = torch.stack([torch.cat([torch.arange(37 + i), torch.arange(s - 37 - i)]) for i in range(b)])
    return q, k, positions


@pytest.mark.parametrize("shape", SHAPES)
def test_reference_and_op_equal_cossinrope_forward_and_gradients_exactly(shape):
    titan = _titan_rope(shape[-1])
    ours = NkiRoPE(NkiRoPE.Config(dim=shape[-1], max_seq_len=4096, theta=1e6))
    q, k, positions = _inputs(*shape)
    q1, k1 = q.clone().requires_grad_(), k.clone().requires_grad_()
    q2, k2 = q.clone().requires_grad_(), k.clone().requires_grad_()
    out_titan = titan(q1, k1, positions)
    out_ours = ours(q2, k2, positions)
    cache = titan._reshape_cache(q, positions)[:, :, 0, :]
    out_ref = rope.rope_reference(q, k, cache)
    for a, b, c in zip(out_titan, out_ours, out_ref, strict=True):
        assert (a - b).abs().max().item() == 0
        assert (a - c).abs().max().item() == 0
    grads = [torch.randn_like(t) for t in out_titan]
    g_titan = torch.autograd.grad(out_titan, (q1, k1), grads)
    g_ours = torch.autograd.grad(out_ours, (q2, k2), grads)
    for a, b in zip(g_titan, g_ours, strict=True):
        assert (a - b).abs().max().item() == 0


def test_bfloat16_inputs_match_cossinrope_exactly():
    titan = _titan_rope(64)
    q, k, positions = _inputs(2, 256, 4, 2, 64, dtype=torch.bfloat16)
    cache = titan._reshape_cache(q, positions)[:, :, 0, :]
    for a, b in zip(titan(q, k, positions), rope.rope_hf(q, k, cache, False), strict=True):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b)


def test_backward_mode_is_the_exact_vjp(monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")  # 128-row sequences keep gradcheck small
    q, k, positions = _inputs(1, 128, 2, 1, 8, dtype=torch.float64)
    cache = _titan_rope(8)._reshape_cache(q, positions)[:, :, 0, :].double()
    assert torch.autograd.gradcheck(
        lambda q, k: rope.rope_hf(q, k, cache, False),
        (q.requires_grad_(), k.requires_grad_()),
        fast_mode=True,
    )


def test_opcheck_fake_and_autograd_registration():
    q, k, positions = _inputs(1, 256, 2, 1, 8)
    cache = _titan_rope(8)._reshape_cache(q, positions)[:, :, 0, :]
    torch.library.opcheck(rope.rope_hf, (q.requires_grad_(), k.requires_grad_(), cache, False))


@pytest.mark.parametrize(
    ("seq_len", "lnc", "nearest"), [(300, 2, "256 or 512"), (100, 2, "256"), (200, 1, "128 or 256")]
)
def test_seq_len_rule_names_the_nearest_valid_values(seq_len, lnc, nearest):
    with pytest.raises(ValueError, match=f"multiple of 128 x LNC = {128 * lnc}.*Nearest valid: {nearest}"):
        rope.check_seq_len(seq_len, lnc)
    rope.check_seq_len(128 * lnc * 3, lnc)


def test_op_checks_the_rule_on_every_device():
    q, k, positions = _inputs(1, 256, 2, 1, 32)
    cache = _titan_rope(32)._reshape_cache(q, positions)[:, :, 0, :]
    with pytest.raises(ValueError, match="multiple of 128 x LNC = 256"):
        rope.rope_hf(q[:, :200], k[:, :200], cache[:, :200], False)


class StandInRopeHF:
    """Stands in for nki-library's rope_hf: enforces its documented contract, computes with the reference."""

    def __init__(self, lnc: int):
        self.lnc, self.calls = lnc, 0

    def __call__(self, q, k, q_out, k_out, cos=None, sin=None, rope_cache=None, backward=False):
        b, hq, s, d = q.shape
        assert k.dim() == 4 and k.shape[0] == b and k.shape[2] == s and k.shape[3] == d, (
            "k must be [B, Hk, S, D]"
        )
        assert q_out.shape == q.shape and k_out.shape == k.shape, "outputs are caller-allocated like q, k"
        assert (cos is None) == (sin is None) and (rope_cache is None) != (cos is None), (
            "cos+sin or rope_cache"
        )
        assert rope_cache.shape[-1] == 2 * d and rope_cache.shape[-2] >= s, "rope_cache [B|-, S, 2D]"
        assert rope_cache.dim() == 2 or rope_cache.shape[0] == b, "rope_cache 2-D or [B, S, 2D]"
        assert rope_cache.dtype == q.dtype, "cos/sin tiles live in q's dtype"
        assert s % (128 * self.lnc) == 0, f"seq len must be multiple of 128 * LNC={self.lnc}"
        assert q.is_contiguous() and k.is_contiguous()
        cache = rope_cache if rope_cache.dim() == 3 else rope_cache.unsqueeze(0)
        qo, ko = rope.rope_reference(q.transpose(1, 2), k.transpose(1, 2), cache, backward)
        q_out.copy_(qo.transpose(1, 2))
        k_out.copy_(ko.transpose(1, 2))
        self.calls += 1
        return q_out, k_out


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("batch_cache", [True, False])
def test_neuron_wrapper_meets_the_kernel_contract(lnc, batch_cache):
    q, k, positions = _inputs(2, 256, 4, 2, 64)
    titan = _titan_rope(64)
    cache = titan._reshape_cache(q, positions if batch_cache else None)[:, :, 0, :]
    kernel = StandInRopeHF(lnc)
    for backward in (False, True):
        got = rope.rope_nki(q, k, cache, backward, kernel, lnc)
        want = rope.rope_reference(q, k, cache, backward)
        for a, b in zip(got, want, strict=True):
            assert (a - b).abs().max().item() == 0
    assert kernel.calls == 2
    with pytest.raises(ValueError, match="Nearest valid"):
        rope.rope_nki(q[:, :192], k[:, :192], cache[:, :192], False, kernel, lnc=2)
