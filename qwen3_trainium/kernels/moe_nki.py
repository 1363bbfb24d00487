"""The Neuron side of the blockwise MoE op: nki-library's ``moe_cte`` and ``blockwise_mm_bwd``.

``check_contract`` states the kernels' documented input contract and raises ValueError (the
kernels themselves only assert). ``forward`` / ``backward`` take the kernel as an argument so
CI can run this exact wrapper code against a stand-in that enforces the same contract.
"""

from __future__ import annotations

import torch

from qwen3_trainium.kernels import neuron

FORWARD_BLOCK_MULTIPLE = 256  # moe_cte shard_on_I: B % 256 == 0
BACKWARD_BLOCK_SIZES = (128, 256, 512, 1024)


def check_contract(hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, block_size, lnc):
    """ValueError naming the first violated rule of the two kernels' shared contract."""
    n_experts, h, two, inter = gate_up.shape
    rules = [
        (hidden.dim() == 2 and hidden.shape[1] == h, f"hidden must be [T+1, H={h}], got {tuple(hidden.shape)}"),
        (two == 2, f"gate_up must be [E, H, 2, I], got {tuple(gate_up.shape)}"),
        (tuple(down.shape) == (n_experts, inter, h), f"down must be [E, I, H] = {(n_experts, inter, h)}, got {tuple(down.shape)}"),
        (tuple(affinities.shape) == (hidden.shape[0] * n_experts, 1), f"affinities must be [(T+1)*E, 1], got {tuple(affinities.shape)}"),
        (token_position_to_id.dtype == torch.int32 and block_to_expert.dtype == torch.int32, "block maps must be int32"),
        (token_position_to_id.numel() == block_to_expert.numel() * block_size, "token_position_to_id must hold N*B slots"),
        (len({hidden.dtype, affinities.dtype, gate_up.dtype, down.dtype}) == 1, "hidden, affinities and weights must share one dtype"),
        (block_size % FORWARD_BLOCK_MULTIPLE == 0 and block_size in BACKWARD_BLOCK_SIZES, f"block_size must be 256, 512 or 1024, got {block_size}"),
        (h % 512 == 0 and 512 <= h <= 8192, f"hidden size must be a multiple of 512 in [512, 8192], got {h}"),
        (inter % 16 == 0 and (inter // lnc) % 32 == 0, f"intermediate size must be a multiple of 16 and of 32 per core (LNC={lnc}), got {inter}"),
        ((h // lnc) % 32 == 0, f"hidden size per core must be a multiple of 32 (LNC={lnc})"),
        (lnc in (1, 2), f"LNC must be 1 or 2, got {lnc}"),
    ]  # fmt: skip
    for ok, message in rules:
        if not ok:
            raise ValueError(f"NKI blockwise MoE: {message}")


def _forward_kernel():
    from nkilib.core.moe.moe_cte import moe_cte

    return neuron.wrapped(moe_cte)


def _backward_kernel():
    from nkilib.experimental.moe.bwd.blockwise_mm_backward import blockwise_mm_bwd

    return neuron.wrapped(blockwise_mm_bwd)


def _forward_options():
    from nkilib.core.moe.moe_cte import MoECTEImplementation, MoECTESpec, ShardOnIConfig
    from nkilib.core.utils.common_types import ActFnType, ExpertAffinityScaleMode

    spec = MoECTESpec(
        implementation=MoECTEImplementation.shard_on_i,
        shard_on_I=ShardOnIConfig(checkpoint_activation=True, expert_affinity_multiply_on_I=False),
    )
    return {
        "spec": spec,
        "activation_function": ActFnType.SiLU,
        "expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE,
    }


def _cast(dtype, *tensors):
    return [t.to(dtype).contiguous() for t in tensors]


def forward(
    hidden,
    affinities,
    gate_up,
    down,
    tpid,
    b2e,
    block_size,
    compute_dtype,
    *,
    kernel=None,
    options=None,
    lnc=None,
):
    """``(out, gate_up_act_T, down_act)`` from ``moe_cte`` (checkpointing, POST_SCALE)."""
    lnc = lnc or neuron.lnc()
    dtype = getattr(torch, compute_dtype)
    args = _cast(dtype, hidden, affinities, gate_up, down)
    check_contract(*args, tpid, b2e, block_size, lnc)
    out, gate_up_act, down_act = (kernel or _forward_kernel())(
        hidden_states=args[0],
        expert_affinities_masked=args[1],
        gate_up_proj_weight=args[2],
        down_proj_weight=args[3],
        token_position_to_id=tpid,
        block_to_expert=b2e,
        block_size=block_size,
        is_tensor_update_accumulating=True,
        **(options if options is not None else _forward_options()),
    )
    return out.to(hidden.dtype), gate_up_act, down_act


def backward(
    grad_out,
    hidden,
    affinities,
    gate_up,
    down,
    tpid,
    b2e,
    gate_up_act,
    down_act,
    block_size,
    *,
    kernel=None,
    lnc=None,
):
    """Gradients of hidden, affinities, gate_up, down from ``blockwise_mm_bwd``."""
    lnc = lnc or neuron.lnc()
    dtype = gate_up_act.dtype
    args = _cast(dtype, hidden, affinities, gate_up, down)
    check_contract(*args, tpid, b2e, block_size, lnc)
    grads = (kernel or _backward_kernel())(
        args[0], args[1], args[2], args[3], gate_up_act, down_act, tpid, b2e,
        grad_out.to(dtype).contiguous(), block_size=block_size, is_tensor_update_accumulating=True,
    )  # fmt: skip
    d_hidden, d_aff, d_gate_up, d_down = grads[:4]
    return (
        d_hidden.to(hidden.dtype),
        d_aff.to(affinities.dtype),
        d_gate_up.to(gate_up.dtype),
        d_down.to(down.dtype),
    )
