"""Blockwise MoE: block packing, parity with torchtitan's MoE, gradcheck, the Neuron wrapper contract."""

from __future__ import annotations

import copy
import zlib

import pytest
import torch
import torch.nn.functional as F
from torchtitan.config import apply_overrides
from torchtitan.models.common.moe import GroupedExperts, MoE

from qwen3_trainium.config import flavors
from qwen3_trainium.models import expert_layout
from qwen3_trainium.models.kernels import moe, moe_nki
from tests.support import nki_standins as standins


def _routing(num_tokens=50, top_k=2, num_experts=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)])
    scores = torch.rand(num_tokens, top_k, generator=gen)
    return ids, scores


@pytest.mark.parametrize(
    ("num_tokens", "top_k", "num_experts", "block"), [(50, 2, 4, 256), (700, 8, 16, 256), (300, 2, 8, 512)]
)
def test_pack_blocks_places_every_assignment_once_in_its_experts_blocks(
    num_tokens, top_k, num_experts, block
):
    ids, _ = _routing(num_tokens, top_k, num_experts)
    tpid, b2e = moe.pack_blocks(ids, num_experts, block)
    n_blocks = moe.num_blocks(num_tokens, top_k, num_experts, block)
    assert tpid.dtype == b2e.dtype == torch.int32
    assert tpid.shape == (n_blocks * block,) and b2e.shape == (n_blocks,)
    assert torch.all(b2e[1:] >= b2e[:-1])  # contiguous runs in expert order
    slots = tpid.view(n_blocks, block).long()
    for e in range(num_experts):
        tokens = slots[b2e == e].flatten()
        tokens = tokens[tokens != num_tokens]  # padding slots point at row T
        want = torch.nonzero((ids == e).any(1)).flatten()
        assert torch.equal(tokens, want)  # each token once, in token order
    counts = torch.bincount(ids.flatten(), minlength=num_experts)
    assert int((tpid != num_tokens).sum()) == num_tokens * top_k
    needed = (counts + block - 1) // block
    assert torch.equal(
        torch.bincount(b2e.long(), minlength=num_experts)[:-1], needed[:-1]
    )  # spares: last expert


class Float32GroupedExperts(GroupedExperts):
    """torchtitan's GroupedExperts minus its hard-coded bfloat16 casts (for a float32 comparison)."""

    def forward(self, x_RD, num_tokens_per_expert_E):
        offsets = torch.cumsum(num_tokens_per_expert_E, dim=0, dtype=torch.int32)
        h = F.silu(torch._grouped_mm(x_RD, self.w1_EFD.transpose(-2, -1), offs=offsets))
        h = h * torch._grouped_mm(x_RD, self.w3_EFD.transpose(-2, -1), offs=offsets)
        return torch._grouped_mm(h, self.w2_EDF.transpose(-2, -1), offs=offsets)


def _moe_pair(compute_dtype: str, float32_reference: bool):
    """torchtitan's MoE layer of tiny_moe and the same layer with the moe_experts override."""
    from torchtitan.config import OverrideConfig

    spec = flavors.model_spec("tiny_moe", "varlen")
    spec.model.layers = spec.model.layers[:1]
    titan_cfg = copy.deepcopy(spec.model.layers[0].moe)
    entry = (
        "qwen3_trainium.models.overrides.nki.moe_experts",
        {"block_size": 256, "compute_dtype": compute_dtype},
    )
    apply_overrides(OverrideConfig(imports=[entry]), spec)  # the same swap a rank makes
    ours_cfg = spec.model.layers[0].moe
    torch.manual_seed(0)
    titan, ours = MoE(titan_cfg), MoE(ours_cfg)
    with torch.no_grad():
        for name, p in titan.named_parameters():
            p.copy_(
                torch.randn(p.shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode()))) * 0.1
            )
        titan.expert_bias_E.zero_()
    ours.load_state_dict(expert_layout.to_fused(titan.state_dict()))  # the same weights
    if float32_reference:
        titan.routed_experts.inner_experts.__class__ = Float32GroupedExperts
    return titan, ours


def _run(module, x):
    x = x.clone().requires_grad_()
    out = module(x)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad_out)
    grads = {name: p.grad.clone() for name, p in module.named_parameters()}
    return out.detach(), x.grad, grads


def test_float32_reference_matches_torchtitan_moe_outputs_and_all_gradients():
    titan, ours = _moe_pair("float32", float32_reference=True)
    x = torch.randn(2, 256, 256, generator=torch.Generator().manual_seed(2))
    out_t, dx_t, g_t = _run(titan, x)
    out_o, dx_o, g_o = _run(ours, x)
    g_o = expert_layout.to_titan(g_o)  # fused grads in torchtitan's layout
    pairs = {"out": (out_t, out_o), "x.grad": (dx_t, dx_o)} | {f"{n}.grad": (g_t[n], g_o[n]) for n in g_t}
    report = {
        k: f"{(a - b).abs().max().item():.2e} (|ref| max {a.abs().max().item():.1f})"
        for k, (a, b) in pairs.items()
    }
    print("max abs diff, float32 reference vs torchtitan MoE:", report)
    assert set(g_t) == set(g_o) and "router.gate.weight" in g_t
    for name, (a, b) in pairs.items():  # weight grads are sums over all tokens: 1e-5 of their size
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=name)


def test_fused_experts_are_exact_against_the_reference_on_torchtitans_weights():
    """float32, max abs diff 0: the fused layout computes what the reference op computes on
    torchtitan's w1/w2/w3 stacked into the kernel's layout (this override's former per-step copy),
    outputs and every gradient."""
    titan, ours = _moe_pair("float32", float32_reference=True)
    x = torch.randn(2, 256, 256, generator=torch.Generator().manual_seed(2))

    def stacked_copy(self, x_BLD, scores_BLK, ids_BLK, _counts):
        experts = titan.routed_experts.inner_experts
        w1, w2, w3 = experts.w1_EFD, experts.w2_EDF, experts.w3_EFD
        gate_up = torch.stack([w1.transpose(1, 2), w3.transpose(1, 2)], dim=2).contiguous()
        out = moe.routed_experts(
            x_BLD.reshape(-1, x_BLD.shape[-1]), scores_BLK.reshape(-1, scores_BLK.shape[-1]),
            ids_BLK.reshape(-1, ids_BLK.shape[-1]), gate_up, w2.transpose(1, 2).contiguous(),
            block_size=256, compute_dtype="float32",
        )  # fmt: skip
        return out.view(x_BLD.shape)

    titan.routed_experts.forward = stacked_copy.__get__(titan.routed_experts)
    out_r, dx_r, g_r = _run(titan, x)
    out_o, dx_o, g_o = _run(ours, x)
    g_o = expert_layout.to_titan(g_o)
    diffs = {"out": (out_r - out_o).abs().max().item(), "x.grad": (dx_r - dx_o).abs().max().item()}
    diffs |= {f"{n}.grad": (g_r[n] - g_o[n]).abs().max().item() for n in g_r}
    print("max abs diff, fused layout vs reference on stacked torchtitan weights:", diffs)
    assert set(g_r) == set(g_o) and all(d == 0.0 for d in diffs.values()), diffs


def test_bfloat16_compute_matches_stock_torchtitan_forward_to_bfloat16_rounding():
    """Both compute the experts in bfloat16, blocks against grouped GEMMs: the sums round apart
    in a few elements (measured: 0.2% of them, by at most one bfloat16 step), never more."""
    titan, ours = _moe_pair("bfloat16", float32_reference=False)
    x = torch.randn(1, 256, 256, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want, got = titan(x), ours(x)
    torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-7)
    assert (got == want).float().mean().item() > 0.99


def _op_args(dtype, num_tokens=20, top_k=2, num_experts=3, dim=8, inter=6, block=256):
    ids, scores = _routing(num_tokens, top_k, num_experts, seed=4)
    gen = torch.Generator().manual_seed(5)
    hidden = torch.cat(
        [torch.randn(num_tokens, dim, generator=gen, dtype=dtype), torch.zeros(1, dim, dtype=dtype)]
    )
    affinities = moe.dense_affinities(scores.to(dtype), ids, num_experts)
    gate_up = torch.randn(num_experts, dim, 2, inter, generator=gen, dtype=dtype)
    down = torch.randn(num_experts, inter, dim, generator=gen, dtype=dtype)
    tpid, b2e = moe.pack_blocks(ids, num_experts, block)
    return hidden, affinities, gate_up, down, tpid, b2e, block


def test_op_gradcheck_float64():
    hidden, aff, gate_up, down, tpid, b2e, block = _op_args(torch.float64)
    inputs = tuple(t.requires_grad_() for t in (hidden, aff, gate_up, down))

    def op(h, a, g, d):
        return moe.moe_blockwise(h, a, g, d, tpid, b2e, block, "float64")[0]

    assert torch.autograd.gradcheck(op, inputs)


def test_opcheck_fake_and_autograd_registration():
    hidden, aff, gate_up, down, tpid, b2e, block = _op_args(torch.float32)
    args = (hidden.requires_grad_(), aff, gate_up.requires_grad_(), down, tpid, b2e, block, "float32")
    # The reference backward walks the block map on the host, so it is not traced by AOT autograd
    # with dynamic shapes (on Neuron the backward is the NKI kernel): schema, fake and autograd checks.
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(moe.moe_blockwise, args, test_utils=checks)


def test_the_backward_is_an_op_whose_fake_matches_it():
    """memory=trace runs the backward on fake tensors: its fake gives the real grads' shapes."""
    hidden, aff, gate_up, down, tpid, b2e, block = _op_args(torch.float32)
    out, gate_up_act, down_act = moe.moe_blockwise(hidden, aff, gate_up, down, tpid, b2e, block, "float32")
    args = (torch.ones_like(out), hidden, aff, gate_up, down, tpid, b2e, gate_up_act, down_act, block)
    torch.library.opcheck(moe.moe_blockwise_backward, args, test_utils=("test_schema", "test_faketensor"))
    expected = moe.moe_reference_backward(*args)
    for got, want in zip(moe.moe_blockwise_backward(*args), expected, strict=True):
        assert torch.equal(got, want)


def test_pack_blocks_on_fake_routing_has_the_real_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    ids, _ = _routing(700, 8, 16, seed=2)
    real = moe.pack_blocks(ids, 16, 256)
    with FakeTensorMode() as mode:
        fake = moe.pack_blocks(mode.from_tensor(ids), 16, 256)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_neuron_call_code_meets_the_documented_convention(lnc, compute_dtype):
    """moe_nki against stand-ins: kernel[lnc](...), primitives across the traced boundary (the spec
    built inside), compute_dtype passed as an NKI dtype, results from return values."""
    args = _op_args(torch.float32, num_tokens=64, num_experts=4, dim=512, inter=128)
    api = standins.moe_api()
    out, gu_act, down_act = moe_nki.forward(*args, compute_dtype, api=api, lnc=lnc)
    cast = [t.to(getattr(torch, compute_dtype)) for t in args[:4]]
    ref = moe.moe_reference(*cast, *args[4:], getattr(torch, compute_dtype))
    assert torch.equal(out, ref[0].float()) and torch.equal(gu_act, ref[1]) and torch.equal(down_act, ref[2])
    grad_out = torch.randn_like(out)
    grads = moe_nki.backward(grad_out, *args[:6], gu_act, down_act, args[6], api=api, lnc=lnc)
    want = moe.moe_reference_backward(grad_out.to(gu_act.dtype), *cast, *args[4:6], gu_act, down_act, args[6])
    assert all(torch.equal(a, b.to(a.dtype)) for a, b in zip(grads, want, strict=True))
    assert api.blockwise_mm_bwd.launches == [lnc]


def test_stand_ins_refuse_a_spec_across_the_boundary_and_a_call_without_the_grid():
    api = standins.moe_api()
    kernel = moe_nki.forward_kernel(api)
    hidden, aff, gate_up, down, tpid, b2e, block = _op_args(
        torch.float32, num_tokens=64, num_experts=4, dim=512, inter=128
    )
    spec = api.MoECTESpec(implementation=api.MoECTEImplementation.shard_on_i)
    with pytest.raises(AssertionError, match="MoECTESpec crossed the kernel boundary"):
        kernel[2](hidden, aff, gate_up, down, tpid, b2e, block, "nl.float32", True, spec)
    with pytest.raises(AssertionError, match="without a launch grid"):
        api.blockwise_mm_bwd(hidden_states=hidden)


def test_the_op_on_neuron_runs_both_kernels(monkeypatch):
    """The custom op's Neuron branch end to end (stand-ins): forward and backward through the kernels."""
    api = standins.moe_api()
    monkeypatch.setattr(moe.neuron, "on_neuron", lambda *tensors: True)
    monkeypatch.setattr(moe_nki, "nki_api", lambda: api)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    hidden, aff, gate_up, down, tpid, b2e, block = _op_args(
        torch.float32, num_tokens=64, num_experts=4, dim=512, inter=128
    )
    leaves = [t.clone().requires_grad_() for t in (hidden, aff, gate_up, down)]
    out, _, _ = moe.moe_blockwise(*leaves, tpid, b2e, block, "float32")
    out.sum().backward()
    ref = moe.moe_reference(hidden, aff, gate_up, down, tpid, b2e, block, torch.float32)
    assert torch.equal(out, ref[0]) and all(leaf.grad is not None for leaf in leaves)
    assert api.blockwise_mm_bwd.launches == [2]


def test_contract_violations_are_clear_errors():
    args = list(_op_args(torch.float32, dim=256, inter=64))
    with pytest.raises(ValueError, match="hidden size must be a multiple of 512"):
        moe_nki.check_contract(*args, lnc=2)
    args = list(_op_args(torch.float32, dim=512, inter=64, block=128))
    with pytest.raises(ValueError, match="block_size must be 256, 512 or 1024"):
        moe_nki.check_contract(*args, lnc=2)
    args = list(_op_args(torch.float32, dim=512, inter=96))
    with pytest.raises(ValueError, match="expert width I must be at least 128, got 96"):
        moe_nki.check_contract(*args, lnc=1)


def test_the_ops_flops_are_the_references_own_matmuls():
    """torch's flop counter sees the custom ops as one op each; their formulas must count what the
    reference computes, matmul by matmul (padding slots included), forward and backward."""
    from torch.utils.flop_counter import FlopCounterMode

    hidden, aff, gate_up, down, tpid, b2e, block = _op_args(torch.float32)
    with FlopCounterMode(display=False) as by_matmul:
        out, gate_up_act, down_act = moe.moe_reference(
            hidden, aff, gate_up, down, tpid, b2e, block, torch.float32
        )
    with FlopCounterMode(display=False) as by_op:
        moe.moe_blockwise(hidden, aff, gate_up, down, tpid, b2e, block, "float32")
    assert by_op.get_total_flops() == by_matmul.get_total_flops() > 0
    args = (torch.ones_like(out), hidden, aff, gate_up, down, tpid, b2e, gate_up_act, down_act, block)
    with FlopCounterMode(display=False) as by_matmul:
        moe.moe_reference_backward(*args)
    with FlopCounterMode(display=False) as by_op:
        moe.moe_blockwise_backward(*args)
    assert by_op.get_total_flops() == by_matmul.get_total_flops() > 0
