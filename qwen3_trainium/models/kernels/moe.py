"""Blockwise MoE experts (dropless), as a torch custom op with the NKI kernels' interface.

Routing output is packed into fixed-size blocks, each owned by one expert (nki-library's
``moe_cte`` layout):
- ``hidden [T+1, H]``: the tokens plus a zero padding row at index T;
- ``affinities [(T+1)*E, 1]``: token-major routing weights, zero where a token does not use an
  expert (and for the padding row);
- ``token_position_to_id [N*B]`` (int32): the token at each block slot, T for an empty slot;
- ``block_to_expert [N]`` (int32): experts own contiguous runs of blocks in expert order; spare
  blocks go to the last expert. ``N`` is the kernel's static bound, so shapes never depend on
  the routing;
- ``gate_up [E, H, 2, I]`` (gate, up) and ``down [E, I, H]``.

Per block: ``y = (silu(x @ gate) * (x @ up)) @ down`` in ``compute_dtype``, then each row is
scaled by its affinity in float32 and added to its token (POST_SCALE). The op also returns the
activation checkpoints the NKI backward kernel consumes (pre-activation gate/up
``[N, 2, I, B]``, down-projection output ``[N, B, H]``); the reference backward uses them the
same way. On Neuron: ``moe_cte`` (shard_on_I, checkpointing) and ``blockwise_mm_bwd``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils.flop_counter import register_flop_formula

from qwen3_trainium.models.kernels import neuron
from qwen3_trainium.models.kernels.rules import num_blocks


def pack_blocks(topk_ids_TK: torch.Tensor, num_experts: int, block_size: int):
    """Routing -> (token_position_to_id [N*B], block_to_expert [N]), both int32."""
    num_tokens, top_k = topk_ids_TK.shape
    device = topk_ids_TK.device
    n_blocks = num_blocks(num_tokens, top_k, num_experts, block_size)
    if isinstance(topk_ids_TK, FakeTensor):  # memory=trace: static shapes, no routing values
        return (
            torch.full((n_blocks * block_size,), num_tokens, dtype=torch.int32, device=device),
            torch.zeros(n_blocks, dtype=torch.int32, device=device),
        )
    expert_of = topk_ids_TK.reshape(-1).long()
    counts = torch.bincount(expert_of, minlength=num_experts)
    blocks = (counts + block_size - 1) // block_size
    spare = n_blocks - int(blocks.sum())
    assert spare >= 0, "block bound below the blocks needed"  # guaranteed by num_blocks
    blocks[-1] += spare
    block_to_expert = torch.repeat_interleave(torch.arange(num_experts, device=device), blocks)
    # Assignments sorted by (expert, token); each takes the next slot of its expert's blocks.
    token_of = torch.arange(num_tokens, device=device).repeat_interleave(top_k)
    order = torch.argsort(expert_of * num_tokens + token_of)
    sorted_experts = expert_of[order]
    first_assignment = torch.cumsum(counts, 0) - counts
    first_slot = (torch.cumsum(blocks, 0) - blocks) * block_size
    rank = torch.arange(order.numel(), device=device) - first_assignment[sorted_experts]
    slots = first_slot[sorted_experts] + rank
    token_position_to_id = torch.full((n_blocks * block_size,), num_tokens, dtype=torch.long, device=device)
    token_position_to_id[slots] = token_of[order]
    return token_position_to_id.int(), block_to_expert.int()


def dense_affinities(
    topk_scores_TK: torch.Tensor, topk_ids_TK: torch.Tensor, num_experts: int
) -> torch.Tensor:
    """``[(T+1)*E, 1]`` token-major affinities with a zero padding row."""
    num_tokens = topk_ids_TK.shape[0]
    dense = topk_scores_TK.new_zeros(num_tokens + 1, num_experts)
    dense[:num_tokens].scatter_(1, topk_ids_TK.long(), topk_scores_TK)
    return dense.reshape(-1, 1)


def _scale_dtype(dtype: torch.dtype) -> torch.dtype:
    """Affinity scaling runs in float32 (as torchtitan's combine does), or wider."""
    return torch.promote_types(dtype, torch.float32)


def _blocks(token_position_to_id, block_to_expert, block_size):
    ids = token_position_to_id.long().view(-1, block_size)
    return [(b, int(e), ids[b]) for b, e in enumerate(block_to_expert.tolist())]


def moe_reference(
    hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, block_size, compute_dtype
):
    """Forward: ``(out [T+1, H], gate_up_act_T [N, 2, I, B], down_act [N, B, H])``."""
    n_experts = gate_up.shape[0]
    aff = affinities.view(-1, n_experts)
    out = torch.zeros_like(hidden)
    n_blocks = block_to_expert.numel()
    inter = gate_up.shape[-1]
    gate_up_act = hidden.new_empty(n_blocks, 2, inter, block_size, dtype=compute_dtype)
    down_act = hidden.new_empty(n_blocks, block_size, hidden.shape[1], dtype=compute_dtype)
    for b, e, ids in _blocks(token_position_to_id, block_to_expert, block_size):
        x = hidden[ids].to(compute_dtype)
        gate = x @ gate_up[e, :, 0, :].to(compute_dtype)
        up = x @ gate_up[e, :, 1, :].to(compute_dtype)
        y = (F.silu(gate) * up) @ down[e].to(compute_dtype)
        gate_up_act[b, 0], gate_up_act[b, 1], down_act[b] = gate.T, up.T, y
        acc = _scale_dtype(hidden.dtype)
        scaled = (y.to(acc) * aff[ids, e].to(acc).unsqueeze(1)).to(hidden.dtype)
        out.index_add_(0, ids, scaled)
    return out, gate_up_act, down_act


def moe_reference_backward(
    grad_out,
    hidden,
    affinities,
    gate_up,
    down,
    token_position_to_id,
    block_to_expert,
    gate_up_act,
    down_act,
    block_size,
):
    """VJP from the checkpoints: grads of hidden, affinities, gate_up, down."""
    n_experts = gate_up.shape[0]
    aff = affinities.view(-1, n_experts)
    d_hidden, d_aff = torch.zeros_like(hidden), torch.zeros_like(aff)
    d_gate_up, d_down = torch.zeros_like(gate_up), torch.zeros_like(down)
    for b, e, ids in _blocks(token_position_to_id, block_to_expert, block_size):
        dtype = gate_up_act.dtype
        x = hidden[ids].to(dtype)
        gate, up, y = gate_up_act[b, 0].T, gate_up_act[b, 1].T, down_act[b]
        acc = _scale_dtype(hidden.dtype)
        g_out = grad_out[ids].to(acc)
        d_aff[:, e].index_add_(0, ids, (g_out * y.to(acc)).sum(1).to(aff.dtype))
        dy = (g_out * aff[ids, e].to(acc).unsqueeze(1)).to(dtype)
        act = F.silu(gate) * up
        d_down[e] += (act.T @ dy).to(down.dtype)
        d_act = dy @ down[e].to(dtype).T
        sig = torch.sigmoid(gate)
        d_gate = d_act * up * sig * (1 + gate * (1 - sig))
        d_up = d_act * F.silu(gate)
        d_gate_up[e, :, 0, :] += (x.T @ d_gate).to(gate_up.dtype)
        d_gate_up[e, :, 1, :] += (x.T @ d_up).to(gate_up.dtype)
        w = gate_up[e].to(dtype)
        dx = d_gate @ w[:, 0, :].T + d_up @ w[:, 1, :].T
        d_hidden.index_add_(0, ids, dx.to(hidden.dtype))
    return d_hidden, d_aff.reshape(-1, 1), d_gate_up, d_down


def _dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}[name]


@torch.library.custom_op("qwen3_trainium::moe_blockwise", mutates_args=())
def moe_blockwise(
    hidden: torch.Tensor,
    affinities: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
    compute_dtype: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if neuron.on_neuron(hidden, gate_up, down):
        from qwen3_trainium.models.kernels import moe_nki

        return moe_nki.forward(
            hidden,
            affinities,
            gate_up,
            down,
            token_position_to_id,
            block_to_expert,
            block_size,
            compute_dtype,
        )
    return moe_reference(
        hidden,
        affinities,
        gate_up,
        down,
        token_position_to_id,
        block_to_expert,
        block_size,
        _dtype(compute_dtype),
    )


@moe_blockwise.register_fake
def _(hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, block_size, compute_dtype):
    n_blocks, inter, dtype = block_to_expert.shape[0], gate_up.shape[-1], _dtype(compute_dtype)
    return (
        torch.empty_like(hidden),
        hidden.new_empty(n_blocks, 2, inter, block_size, dtype=dtype),
        hidden.new_empty(n_blocks, block_size, hidden.shape[1], dtype=dtype),
    )


def _setup_context(ctx, inputs, output):
    hidden, affinities, gate_up, down, tpid, b2e, block_size, _ = inputs
    _, gate_up_act, down_act = output
    ctx.save_for_backward(hidden, affinities, gate_up, down, tpid, b2e, gate_up_act, down_act)
    ctx.block_size = block_size


@torch.library.custom_op("qwen3_trainium::moe_blockwise_backward", mutates_args=())
def moe_blockwise_backward(
    grad_out: torch.Tensor,
    hidden: torch.Tensor,
    affinities: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    gate_up_act: torch.Tensor,
    down_act: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grads of hidden, affinities, gate_up, down: an op of its own, so the backward has a fake
    implementation too (its block loop reads the routing, which a fake tensor does not hold)."""
    saved = (hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, gate_up_act, down_act)
    if neuron.on_neuron(hidden, gate_up, down):
        from qwen3_trainium.models.kernels import moe_nki

        return tuple(moe_nki.backward(grad_out, *saved, block_size))
    return tuple(moe_reference_backward(grad_out, *saved, block_size))


@moe_blockwise_backward.register_fake
def _(grad_out, hidden, affinities, gate_up, down, *_rest):
    return (
        torch.empty_like(hidden),
        torch.empty_like(affinities),
        torch.empty_like(gate_up),
        torch.empty_like(down),
    )


def _backward(ctx, grad_out, _grad_gate_up_act, _grad_down_act):
    grads = moe_blockwise_backward(grad_out, *ctx.saved_tensors, ctx.block_size)
    return (*grads, None, None, None, None)


moe_blockwise.register_autograd(_backward, setup_context=_setup_context)


# FLOPs of the two ops, for torch's flop counter and the roofline (``memory/roofline.py``): the
# kernels compute every slot of every block, padding included, so S = blocks x block_size rows.
# Forward: gate and up (2 x 2SHI) and down (2SIH); backward: down's two gradients, gate/up's
# input gradients and weight gradients (2 + 2 + 4 + 4, x SHI). Elementwise work is not counted,
# as torch's own formulas do not count it. Checked against the reference's own matmuls
# (tests/models/test_kernel_moe.py).
def _slot_flops(hidden_shape, gate_up_shape, block_to_expert_shape, block_size: int, per_slot: int) -> int:
    return per_slot * block_to_expert_shape[0] * block_size * hidden_shape[1] * gate_up_shape[-1]


@register_flop_formula(torch.ops.qwen3_trainium.moe_blockwise)
def _forward_flops(hidden, _aff, gate_up, _down, _tpid, b2e, block_size, *_rest, **_kwargs) -> int:
    return _slot_flops(hidden, gate_up, b2e, block_size, 6)


@register_flop_formula(torch.ops.qwen3_trainium.moe_blockwise_backward)
def _backward_flops(_grad, hidden, _aff, gate_up, _down, _tpid, b2e, _gua, _da, block_size, **_kwargs) -> int:
    return _slot_flops(hidden, gate_up, b2e, block_size, 12)


def routed_experts(x_TD, topk_scores_TK, topk_ids_TK, gate_up, down, *, block_size: int, compute_dtype: str):
    """torchtitan's routed-experts computation (dispatch, experts, combine) done blockwise, on the
    experts as they are stored (``overrides/blockwise_experts.py``): ``gate_up [E, H, 2, I]`` and
    ``down [E, I, H]``, the kernel's own layout. Nothing of the weights is copied, so the op saves
    the parameters themselves for backward and FSDP can free the gathered experts after forward."""
    num_experts = gate_up.shape[0]
    hidden = torch.cat([x_TD, x_TD.new_zeros(1, x_TD.shape[1])])
    affinities = dense_affinities(topk_scores_TK, topk_ids_TK, num_experts)
    tpid, b2e = pack_blocks(topk_ids_TK, num_experts, block_size)
    out, _, _ = moe_blockwise(hidden, affinities, gate_up, down, tpid, b2e, block_size, compute_dtype)
    return out[:-1]
