"""The Neuron side of the blockwise MoE op: nki-library's ``moe_cte`` and ``blockwise_mm_bwd``.

Sources (see ``neuron.py`` for the versions): ``nkilib/core/moe/moe_cte/moe_cte.py`` (``moe_cte`` is
``@nki.jit(mode="trace")`` and takes a ``MoECTESpec`` dataclass; ``compute_dtype`` is an NKI
dtype, default ``nl.bfloat16``; shard_on_I with ``checkpoint_activation=True`` returns
``(output, gate_up_activations_T [N, 2, I, B], down_activations [N, B, H])``, bwmm_shard_on_I.py)
and ``nkilib/experimental/moe/bwd/blockwise_mm_backward.py`` (``@nki.jit``, returns the four
gradients). Public callers (vllm-neuron's ``functional/moe/moe_cte.py``) do not pass the spec
across the kernel boundary: a traced function takes primitives and builds ``MoECTESpec`` inside;
they use the kernel only from an expert width ``I >= 128``. ``check_contract`` states the rules
and raises ValueError where the kernels would only assert.

``forward`` / ``backward`` take the NKI objects (``api``) as an argument, so CPU tests run this
exact call code against stand-ins that enforce the documented convention.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from qwen3_trainium.models.kernels import neuron

FORWARD_BLOCK_MULTIPLE = 256  # moe_cte shard_on_I: "Blocksize must be a multiple of 256"
BACKWARD_BLOCK_SIZES = (128, 256, 512, 1024)  # blockwise_mm_bwd's assert
MIN_EXPERT_WIDTH = 128  # vllm-neuron's moe_cte wrapper: I_TP < 128 never reaches the kernel


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
        (inter >= MIN_EXPERT_WIDTH, f"expert width I must be at least {MIN_EXPERT_WIDTH}, got {inter}"),
        (inter % 16 == 0 and (inter // lnc) % 32 == 0, f"intermediate size must be a multiple of 16 and of 32 per core (LNC={lnc}), got {inter}"),
        ((h // lnc) % 32 == 0, f"hidden size per core must be a multiple of 32 (LNC={lnc})"),
        (lnc in (1, 2), f"LNC must be 1 or 2, got {lnc}"),
    ]  # fmt: skip
    for ok, message in rules:
        if not ok:
            raise ValueError(f"NKI blockwise MoE: {message}")


def nki_api() -> SimpleNamespace:
    """The NKI objects the wrappers call (Trainium hosts only)."""
    import nki
    import nki.language as nl
    from nkilib.core.moe.moe_cte.moe_cte import (
        ActFnType,
        ExpertAffinityScaleMode,
        MoECTEImplementation,
        MoECTESpec,
        ShardOnIConfig,
        moe_cte,
    )
    from nkilib.experimental.moe.bwd.blockwise_mm_backward import blockwise_mm_bwd

    return SimpleNamespace(
        jit=nki.jit, nl=nl, moe_cte=moe_cte, blockwise_mm_bwd=blockwise_mm_bwd, MoECTESpec=MoECTESpec,
        MoECTEImplementation=MoECTEImplementation, ShardOnIConfig=ShardOnIConfig, ActFnType=ActFnType,
        ExpertAffinityScaleMode=ExpertAffinityScaleMode,
    )  # fmt: skip


_FORWARD_KERNELS: dict[int, object] = {}


def forward_kernel(api: SimpleNamespace):
    """``moe_cte`` behind a traced function that takes primitives only (tensors, ints, bools, an
    NKI dtype) and builds ``MoECTESpec`` inside it, as vllm-neuron's wrapper does."""
    if id(api) in _FORWARD_KERNELS:
        return _FORWARD_KERNELS[id(api)]

    @api.jit(mode="trace")
    def moe_cte_shard_on_i(
        hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight,
        token_position_to_id, block_to_expert, block_size, compute_dtype, checkpoint_activation,
    ):  # fmt: skip
        spec = api.MoECTESpec(
            implementation=api.MoECTEImplementation.shard_on_i,
            shard_on_I=api.ShardOnIConfig(
                checkpoint_activation=checkpoint_activation, expert_affinity_multiply_on_I=False
            ),
        )
        return api.moe_cte(
            hidden_states=hidden_states,
            expert_affinities_masked=expert_affinities_masked,
            gate_up_proj_weight=gate_up_proj_weight,
            down_proj_weight=down_proj_weight,
            token_position_to_id=token_position_to_id,
            block_to_expert=block_to_expert,
            block_size=block_size,
            spec=spec,
            activation_function=api.ActFnType.SiLU,
            compute_dtype=compute_dtype,
            is_tensor_update_accumulating=True,
            expert_affinities_scaling_mode=api.ExpertAffinityScaleMode.POST_SCALE,
        )

    _FORWARD_KERNELS[id(api)] = moe_cte_shard_on_i
    return moe_cte_shard_on_i


def _cast(dtype, *tensors):
    return [t.to(dtype).contiguous() for t in tensors]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def forward(hidden, affinities, gate_up, down, tpid, b2e, block_size, compute_dtype, *, api=None, lnc=None):
    """``(out, gate_up_act_T, down_act)`` from ``moe_cte`` (shard_on_I, checkpointing, POST_SCALE)
    with ``compute_dtype`` (``model.moe_compute_dtype``) as the kernel's compute dtype."""
    api = api or nki_api()
    lnc = lnc or neuron.lnc()
    args = _cast(getattr(torch, compute_dtype), hidden, affinities, gate_up, down)
    check_contract(*args, tpid, b2e, block_size, lnc)
    out, gate_up_act, down_act = forward_kernel(api)[lnc](
        hidden_states=args[0], expert_affinities_masked=args[1], gate_up_proj_weight=args[2],
        down_proj_weight=args[3], token_position_to_id=tpid, block_to_expert=b2e, block_size=block_size,
        compute_dtype=getattr(api.nl, compute_dtype), checkpoint_activation=True,
    )  # fmt: skip
    return out.to(hidden.dtype), gate_up_act, down_act


def backward(grad_out, hidden, affinities, gate_up, down, tpid, b2e, gate_up_act, down_act, block_size,
             *, api=None, lnc=None):  # fmt: skip
    """Gradients of hidden, affinities, gate_up, down from ``blockwise_mm_bwd``, computed in the
    forward's compute dtype (the dtype of its activation checkpoints)."""
    api = api or nki_api()
    lnc = lnc or neuron.lnc()
    dtype = gate_up_act.dtype
    args = _cast(dtype, hidden, affinities, gate_up, down)
    check_contract(*args, tpid, b2e, block_size, lnc)
    grads = api.blockwise_mm_bwd[lnc](
        hidden_states=args[0], expert_affinities_masked=args[1], gate_up_proj_weight=args[2],
        down_proj_weight=args[3], gate_up_proj_act_checkpoint_T=gate_up_act,
        down_proj_act_checkpoint=down_act, token_position_to_id=tpid, block_to_expert=b2e,
        output_hidden_states_grad=grad_out.to(dtype).contiguous(), block_size=block_size,
        compute_dtype=getattr(api.nl, _dtype_name(dtype)), is_tensor_update_accumulating=True,
    )  # fmt: skip
    d_hidden, d_aff, d_gate_up, d_down = grads[:4]
    return (
        d_hidden.to(hidden.dtype),
        d_aff.to(affinities.dtype),
        d_gate_up.to(gate_up.dtype),
        d_down.to(down.dtype),
    )
