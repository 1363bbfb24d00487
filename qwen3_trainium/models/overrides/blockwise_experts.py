"""Routed experts stored in the NKI kernels' layout and computed blockwise (``model=nki_moe``).

nki-library's ``moe_cte`` and ``blockwise_mm_bwd`` take ``gate_up [E, H, 2, I]`` and
``down [E, I, H]`` (``nkilib/core/moe/moe_cte/moe_cte.py``); torchtitan stores ``w1_EFD`` /
``w3_EFD [E, I, H]`` and ``w2_EDF [E, H, I]``. Stacking those into the kernel's layout in every
forward made a full copy of each layer's gathered experts, and the op saved the copy for
backward: with FSDP every layer's experts then stayed gathered until its backward (Qwen3-30B-A3B at
T=4096 without activation checkpointing: 105.0 GiB a trn2 rank, traced; docs/moe.md). As neuronx-distributed does (one fused gate/up parameter whose
``[E, H, 2, I]`` kernel view is free, ``neuronx_distributed/modules/moe/blockwise.py``), the
parameters here are the kernel's layout:

- ``FusedExperts.gate_up_ED2F [E, D, 2, F]`` (index 0 the gate, 1 the up projection) and
  ``down_EFD [E, F, D]``, in torchtitan's shape legend (D = H, the model dim; F = I, the expert
  width). The op reads them as they are and autograd saves the parameters themselves.
- Initialised exactly as torchtitan's ``GroupedExperts``: its initialisers, in its order, on
  tensors of its shapes, then transposed in; a seed gives the same model in both layouts.
- Sharded by torchtitan's own rules for its experts: FSDP on the expert dim 0 while the FSDP
  degree is at most the expert count, else on dim 1 (``apply_fsdp``'s ``shard_placement_fn``,
  ``torchtitan/distributed/fsdp.py``); tensor parallel on F (``gate_up_ED2F`` dim 3,
  ``down_EFD`` dim 1, so each TP rank keeps matching gate and up). Expert parallel is refused
  with this op before launch (``parent/preflight/model.py``): the kernel keeps every expert.
- Converted once, at the HF boundary (``FusedExpertsStateDictAdapter``, with ``expert_layout.py``,
  the conversion ``convert_experts`` uses too): Hugging Face's
  per-expert ``gate_proj`` / ``up_proj`` / ``down_proj`` in (``initial_load_in_hf``) and out
  (``last_save_in_hf``). torchtitan's own (DCP) checkpoints hold the fused parameters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torchtitan.config import derive
from torchtitan.models.common.moe import GroupedExperts, RoutedExperts
from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
from torchtitan.protocols.module import Module

from qwen3_trainium.models.expert_layout import DOWN, GATE_UP, TITAN_EXPERTS, to_fused, to_titan
from qwen3_trainium.models.kernels import moe as moe_ops

# Where each dim of torchtitan's tensors goes in ours (for shardings and initialisation).
_W1_TO_GATE_UP = {0: 0, 1: 3, 2: 1}  # w1_EFD / w3_EFD [E, F, D] -> gate_up_ED2F [E, D, 2, F]
_W2_TO_DOWN = {0: 0, 1: 2, 2: 1}  # w2_EDF [E, D, F] -> down_EFD [E, F, D]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class FusedExperts(Module):
    """The routed experts' weights in the kernel's layout (computed by ``BlockwiseRoutedExperts``)."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        pass

    def __init__(self, config: Config):
        super().__init__()
        self.num_experts = config.num_experts
        experts, width, dim = config.num_experts, config.hidden_dim, config.dim
        self.gate_up_ED2F = nn.Parameter(torch.empty(experts, dim, 2, width))
        self.down_EFD = nn.Parameter(torch.empty(experts, width, dim))

    def _init_self_parameters(self) -> None:
        """torchtitan's ``GroupedExperts`` initialisers (w1, w2, w3 in its parameter order) on
        tensors of its shapes and shardings, so the random streams and values are the same."""
        init = self._param_init
        if init is None or not set(TITAN_EXPERTS) <= set(init):
            raise ValueError(f"FusedExperts initialises as GroupedExperts: param_init needs {TITAN_EXPERTS}")
        experts, dim, _, width = self.gate_up_ED2F.shape
        with torch.no_grad():
            w1 = _empty_like(self.gate_up_ED2F, (experts, width, dim), _W1_TO_GATE_UP)
            init["w1_EFD"](w1)
            w2 = _empty_like(self.down_EFD, (experts, dim, width), _W2_TO_DOWN)
            init["w2_EDF"](w2)
            w3 = _empty_like(self.gate_up_ED2F, (experts, width, dim), _W1_TO_GATE_UP)
            init["w3_EFD"](w3)
            self.gate_up_ED2F.copy_(torch.stack([w1.transpose(1, 2), w3.transpose(1, 2)], dim=2))
            self.down_EFD.copy_(w2.transpose(1, 2))


def _empty_like(param: torch.Tensor, shape: tuple[int, ...], dims: dict[int, int]) -> torch.Tensor:
    """An empty tensor of torchtitan's ``shape``, sharded as ``param`` is (a DTensor's random
    initialisation depends on its global shape and placements)."""
    if not isinstance(param, DTensor):
        return torch.empty(shape, dtype=param.dtype, device=param.device)
    from torch.distributed.tensor import Shard, empty
    from torch.distributed.tensor.placement_types import _StridedShard

    ours_to_titan = {ours: titan for titan, ours in dims.items()}

    def moved(p):  # FSDP over a tensor-parallel DTensor shards dim 0 strided: keep the kind
        if isinstance(p, _StridedShard):
            return _StridedShard(ours_to_titan[p.dim], split_factor=p.split_factor)
        return Shard(ours_to_titan[p.dim]) if isinstance(p, Shard) else p

    placements = [moved(p) for p in param.placements]
    return empty(shape, dtype=param.dtype, device_mesh=param.device_mesh, placements=placements)


class BlockwiseRoutedExperts(RoutedExperts):
    """torchtitan's routed experts (dispatch, experts, combine) as one ``moe_blockwise`` op."""

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
        out_TD = moe_ops.routed_experts(
            x_BLD.reshape(-1, dim),
            topk_scores_BLK.reshape(-1, top_k),
            topk_expert_ids_BLK.reshape(-1, top_k),
            _local(experts.gate_up_ED2F),
            _local(experts.down_EFD),
            block_size=self.block_size,
            compute_dtype=self.compute_dtype,
        )
        return out_TD.view(batch, seq, dim)


def _remap_layout(layout, dims: dict[int, int]):
    """A torchtitan ``SpmdLayout`` of one of its expert tensors, for ours: each sharded dim moved."""
    import spmd_types as spmd

    axis_types = {
        axis: spmd.S(dims[kind.dim]) if isinstance(kind, spmd.Shard) else kind
        for axis, kind in layout.axis_types.items()
    }
    return dataclasses.replace(layout, axis_types=axis_types)


def fused_config(cfg: RoutedExperts.Config, **fields) -> BlockwiseRoutedExperts.Config:
    """``cfg`` (torchtitan's routed experts, as ``set_moe_sharding_config`` left it) with fused
    experts: the same dims and initialisers, the shardings moved to the new parameters."""
    inner = cfg.inner_experts
    if type(inner) is not GroupedExperts.Config:
        raise ValueError(
            f"moe_experts stores torchtitan's GroupedExperts in the NKI kernels' layout; this model's "
            f"routed experts are {type(inner).__name__} (another override claims them?)"
        )
    fused = derive(inner, FusedExperts.Config)
    sharding = inner.sharding_config
    if sharding is not None and sharding.state_shardings:
        state = {k: v for k, v in sharding.state_shardings.items() if k not in TITAN_EXPERTS}
        state[GATE_UP] = _remap_layout(sharding.state_shardings["w1_EFD"], _W1_TO_GATE_UP)
        state[DOWN] = _remap_layout(sharding.state_shardings["w2_EDF"], _W2_TO_DOWN)
        fused.sharding_config = dataclasses.replace(sharding, state_shardings=state)
    return derive(cfg, BlockwiseRoutedExperts.Config, inner_experts=fused, **fields)


class FusedExpertsStateDictAdapter(Qwen3StateDictAdapter):
    """torchtitan's Qwen3 HF adapter, with the experts converted at the boundary."""

    def to_hf(self, state_dict: dict) -> dict:
        return super().to_hf(to_titan(state_dict))

    def from_hf(self, hf_state_dict: dict) -> dict:
        return to_fused(super().from_hf(hf_state_dict))
