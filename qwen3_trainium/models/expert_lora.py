"""LoRA on the routed experts (``peft.target_modules`` with ``gate_proj``/``up_proj``/``down_proj``
on a MoE flavor), with PEFT 0.21.2's ``target_parameters`` semantics.

Hugging Face's Qwen3-MoE holds each layer's experts as two 3-D parameters, ``gate_up_proj
[E, 2I, H]`` (gate rows first) and ``down_proj [E, H, I]``; PEFT adapts them with
``lora.ParamWrapper`` (``peft/tuners/lora/layer.py``): per expert e an independent rank-r pair,
``W[e] + alpha/r * B_e @ A_e``, one ``A_e`` shared by the gate and the up rows (so gate and up are
adapted together or not at all). Here the pairs are stored expert dim first, so they shard with
the experts under FSDP (dim 0):

- ``lora_a_gate_up [E, r, D]``, ``lora_b_gate_up [E, 2F, r]`` (rows: F gate, then F up);
- ``lora_a_down [E, r, F]``, ``lora_b_down [E, D, r]``;

A initialised as PEFT's (Kaiming-uniform, a=sqrt(5), fan-in = the input width), B zeros.

Two ways to compute, by route:

- torchtitan's grouped experts (``model=native``; ``ParamDtypeGroupedExperts`` on CPU float32):
  the low-rank path is added before the SiLU, ``x W1^T + s (x A^T) B1^T``, with the same grouped
  GEMMs and offsets, so no merged copy of any expert weight exists.
- the fused blockwise op (``model=nki_moe``, ``kernels=[moe_experts]``): SiLU runs inside the
  kernel, so it takes merged weights, recomputed in backward rather than saved
  (``expert_lora_blockwise.py``).

Applied by ``lora.with_lora`` after torchtitan's ``LoRAConverter`` (which would freeze any direct
parameter of a non-Linear config) on the experts configs it left, so it composes with the exact
type overrides (``param_dtype_experts``, ``moe_experts``) already applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn
from torchtitan.models.common.moe import GroupedExperts, RoutedExperts

# re-exported: the names callers know this module by
from qwen3_trainium.models.expert_lora_parts import (  # noqa: F401
    ADAPTER_PARAMS,
    DOWN,
    GATE_UP,
    adapter_shapes,
)
from qwen3_trainium.models.expert_lora_parts import local as _local
from qwen3_trainium.models.overrides.blockwise_experts import BlockwiseRoutedExperts, FusedExperts
from qwen3_trainium.models.overrides.experts import ParamDtypeGroupedExperts

_classes: dict[type, type] = {}


def lora_experts_cls(parent_cls: type) -> type:
    """The LoRA subclass of an experts class (``GroupedExperts``, ``ParamDtypeGroupedExperts``,
    ``FusedExperts``), cached, as torchtitan's ``_get_lora_cls`` does for ``Linear``."""
    if parent_cls in _classes:
        return _classes[parent_cls]
    parent_config = parent_cls.Config

    class LoRAExperts(parent_cls):
        @dataclass(kw_only=True, slots=True)
        class Config(parent_config):
            rank: int
            alpha: float
            parts: tuple = (GATE_UP, DOWN)

        def __init__(self, config):
            super().__init__(config)
            for param in nn.Module.parameters(self):
                param.requires_grad_(False)  # the base experts stay frozen
            self._lora_scaling = config.alpha / config.rank
            self.lora_parts = tuple(config.parts)
            shapes = adapter_shapes(
                config.num_experts, config.dim, config.hidden_dim, config.rank, config.parts
            )
            for name, shape in shapes.items():
                self.register_parameter(name, nn.Parameter(torch.empty(shape)))

        def _init_self_parameters(self) -> None:
            # The base initialisers know the base parameters only: hand them those, then ours.
            adapters = {n: self._parameters.pop(n) for n in ADAPTER_PARAMS if n in self._parameters}
            try:
                super()._init_self_parameters()
            finally:
                self._parameters.update(adapters)
            reset_adapters(self)

    if issubclass(parent_cls, GroupedExperts):
        LoRAExperts.forward = _grouped_forward
    LoRAExperts.__name__ = LoRAExperts.__qualname__ = f"LoRA{parent_cls.__name__}"
    _classes[parent_cls] = LoRAExperts
    return LoRAExperts


@torch.no_grad()
def reset_adapters(experts) -> None:
    """PEFT's LoRA initialisation per expert: ``kaiming_uniform_(a=sqrt(5))`` on A, whose bound is
    1/sqrt(fan-in) with fan-in the input width (A's last dim), and zeros on B."""
    for name in ADAPTER_PARAMS:
        param = getattr(experts, name, None)
        if param is None:
            continue
        if ".lora_a" in f".{name}":
            bound = 1.0 / math.sqrt(param.shape[-1])
            nn.init.uniform_(param, -bound, bound)
        else:
            nn.init.zeros_(param)


def _low_rank(gmm, x, a, b, offsets, dtype):
    """Per expert ``(x A_e^T) B_e^T`` as two grouped GEMMs over the same token groups."""
    return gmm(
        gmm(x, _local(a).to(dtype).transpose(-2, -1), offsets), _local(b).to(dtype).transpose(-2, -1), offsets
    )


def _grouped_forward(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
    """torchtitan's grouped experts (``GroupedExperts.forward``: bfloat16; ``ParamDtypeGroupedExperts``:
    the parameters' dtype) with each adapter's low-rank path added to its projection's output."""
    w1, w2, w3 = (_local(w) for w in (self.w1_EFD, self.w2_EDF, self.w3_EFD))
    # torchtitan's GroupedExperts computes in bfloat16; ``in_param_dtype`` (an instance flag) is
    # for a float32 forward, as ``overrides/experts.py``'s ``float32_experts`` gives it plain experts
    in_param_dtype = isinstance(self, ParamDtypeGroupedExperts) or self.__dict__.get("in_param_dtype", False)
    dtype = w1.dtype if in_param_dtype else torch.bfloat16
    offsets = torch.cumsum(num_tokens_per_expert_E, dim=0, dtype=torch.int32)

    def gmm(a, b_t, offs):
        return torch._grouped_mm(a, b_t, offs=offs)

    x = x_RD.to(dtype)
    gate = gmm(x, w1.to(dtype).transpose(-2, -1), offsets)
    up = gmm(x, w3.to(dtype).transpose(-2, -1), offsets)
    if GATE_UP in self.lora_parts:
        delta = self._lora_scaling * _low_rank(
            gmm, x, self.lora_a_gate_up, self.lora_b_gate_up, offsets, dtype
        )
        gate, up = gate + delta[:, : gate.shape[1]], up + delta[:, gate.shape[1] :]
    h = F.silu(gate) * up
    out = gmm(h, w2.to(dtype).transpose(-2, -1), offsets)
    if DOWN in self.lora_parts:
        out = out + self._lora_scaling * _low_rank(gmm, h, self.lora_a_down, self.lora_b_down, offsets, dtype)
    return out.type_as(x_RD)


def convert_experts(model_config, *, rank: int, alpha: float, parts) -> int:
    """Replace every routed experts config in ``model_config`` (as ``LoRAConverter`` left it) by
    its LoRA form; the number replaced. The blockwise route's own config becomes
    ``LoRABlockwiseRoutedExperts``'s (it holds no parameters that freezing could concern)."""
    from torchtitan.config import derive

    count = 0
    for _, cfg, parent, attr in list(model_config.traverse(RoutedExperts.Config, recurse=True)):
        inner = cfg.inner_experts
        owner = inner._owner  # the experts class; a Frozen* config inherits its owner
        if not issubclass(owner, (GroupedExperts, FusedExperts)):
            raise ValueError(f"expert LoRA: no adapter for {owner.__name__} experts")
        values = {f.name: getattr(inner, f.name) for f in fields(inner) if f.init}
        values["sharding_config"] = _with_adapter_shardings(inner.sharding_config, parts)
        lora_cfg = lora_experts_cls(owner).Config(**values, rank=rank, alpha=alpha, parts=tuple(parts))
        if isinstance(cfg, BlockwiseRoutedExperts.Config):
            from qwen3_trainium.models.expert_lora_blockwise import LoRABlockwiseRoutedExperts

            cfg = derive(cfg, LoRABlockwiseRoutedExperts.Config)
            setattr(parent, attr, cfg) if isinstance(attr, str) else parent.__setitem__(attr, cfg)
        cfg.inner_experts = lora_cfg
        count += 1
    return count


def _with_adapter_shardings(sharding, parts):
    """The experts' sharding config plus the adapters': replicated over the dense mesh axes (FSDP
    shards them on top, as it does the experts, ``apply_fsdp``'s expert placement), as torchtitan
    places its expert weights without expert parallelism (``expert_param_placement_dense``). Their
    tensor-parallel axis is replicated too, which is right only at TP 1: pre-flight refuses tensor
    and expert parallelism with expert LoRA (``parent/preflight/peft.py``)."""
    if sharding is None or not sharding.state_shardings:
        return sharding
    import dataclasses

    import spmd_types as spmd
    from torchtitan.models.common.moe_sharding import expert_param_placement_dense

    names = adapter_shapes(1, 1, 1, 1, parts)
    layout = expert_param_placement_dense(tp_placement=spmd.R)
    return dataclasses.replace(
        sharding, state_shardings={**sharding.state_shardings, **dict.fromkeys(names, layout)}
    )
