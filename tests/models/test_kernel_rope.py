"""rope_hf: exact parity with torchtitan's CosSinRoPE, the custom op, the rule, the Neuron wrapper."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torchtitan.models.common.rope import CosSinRoPE

from qwen3_trainium.models.kernels import rope
from qwen3_trainium.models.overrides.nki import NkiRoPE
from tests.support import nki_standins as standins

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


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("batch_cache", [True, False])
def test_neuron_call_code_meets_the_documented_convention(lnc, batch_cache):
    """rope_nki against a stand-in that needs kernel[lnc](...) and poisons the buffers passed in."""
    q, k, positions = _inputs(2, 256, 4, 2, 64)
    cache = _titan_rope(64)._reshape_cache(q, positions if batch_cache else None)[:, :, 0, :]
    kernel = standins.rope_hf()
    for backward in (False, True):
        got = rope.rope_nki(q, k, cache, backward, kernel, lnc)
        want = rope.rope_reference(q, k, cache, backward)
        for a, b in zip(got, want, strict=True):
            assert (a - b).abs().max().item() == 0
    assert kernel.launches == [lnc, lnc]
    with pytest.raises(ValueError, match="Nearest valid"):
        rope.rope_nki(q[:, :192], k[:, :192], cache[:, :192], False, kernel, lnc=2)


def test_stand_in_catches_a_call_without_the_grid_and_a_read_of_the_buffers():
    q, k, positions = _inputs(1, 256, 2, 1, 32)
    cache = _titan_rope(32)._reshape_cache(q, positions)[0, :, 0, :]
    q_bhsd, k_bhsd = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    q_out, k_out = torch.zeros_like(q_bhsd), torch.zeros_like(k_bhsd)
    kernel = standins.rope_hf()
    with pytest.raises(AssertionError, match="without a launch grid"):
        kernel(q_bhsd, k_bhsd, q_out, k_out, rope_cache=cache, backward=False)
    returned = kernel[2](q_bhsd, k_bhsd, q_out, k_out, rope_cache=cache, backward=False)
    assert torch.isnan(q_out).all() and torch.isnan(k_out).all()  # a caller reading these fails parity
    assert not torch.isnan(returned[0]).any()


def test_the_op_on_neuron_runs_the_kernel_forward_and_backward(monkeypatch):
    """The custom op's Neuron branch end to end (stand-in kernel): equal to CosSinRoPE, gradients too."""
    kernel = standins.rope_hf()
    monkeypatch.setattr(rope.neuron, "on_neuron", lambda *tensors: True)
    monkeypatch.setattr(rope, "_nki_kernel", lambda: kernel)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    q, k, positions = _inputs(2, 256, 4, 2, 64)
    titan = _titan_rope(64)
    ours = NkiRoPE(NkiRoPE.Config(dim=64, max_seq_len=4096, theta=1e6))
    q1, k1 = q.clone().requires_grad_(), k.clone().requires_grad_()
    q2, k2 = q.clone().requires_grad_(), k.clone().requires_grad_()
    out_titan, out_ours = titan(q1, k1, positions), ours(q2, k2, positions)
    grads = [torch.randn_like(t) for t in out_titan]
    pairs = [*zip(out_titan, out_ours, strict=True)]
    pairs += zip(
        torch.autograd.grad(out_titan, (q1, k1), grads),
        torch.autograd.grad(out_ours, (q2, k2), grads),
        strict=True,
    )
    assert all((a - b).abs().max().item() == 0 for a, b in pairs)
    assert kernel.launches == [2, 2]  # forward, then the backward through the same kernel


def test_a_neuron_tensor_without_the_nki_runtime_is_an_error_not_a_silent_reference(monkeypatch):
    neuron_tensor = SimpleNamespace(device=SimpleNamespace(type="neuron"))
    monkeypatch.setattr(rope.neuron, "runtime_error", lambda: "import nki failed (ImportError: no nki)")
    with pytest.raises(RuntimeError, match=r"import nki failed.*model\.kernels=\[\]"):
        rope.neuron.on_neuron(neuron_tensor, neuron_tensor)
    assert rope.neuron.on_neuron(torch.zeros(1)) is False  # CPU tensors: the reference, on purpose
