"""torchtitan's grouped experts computed in the parameters' dtype (CPU, float32).

``GroupedExperts.forward`` casts activations and weights to bfloat16 whatever the configured
precision, because CUDA's grouped GEMM wants it. On CPU, where ``mixed_precision_param`` is
float32 (the ``auto`` default there), that made the native MoE the only part of a float32 run
computed in bfloat16: its HF export could not match Transformers' float32 Qwen3-MoE (5.8e-4 max
abs logit diff measured on tiny_moe). ``torch._grouped_mm`` runs float32 on CPU, so this override
keeps the same parameters and the same three grouped GEMMs without the casts.
Activated by ``titan.override_imports`` on CPU with float32 parameters; ``float32_experts``
lends its forward to torchtitan's experts for one float32 forward on any device and dtype.
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchtitan.config import derive, override
from torchtitan.models.common.moe import GroupedExperts


class ParamDtypeGroupedExperts(GroupedExperts):
    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        pass

    def forward(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        offsets_E = torch.cumsum(num_tokens_per_expert_E, dim=0, dtype=torch.int32)
        w1, w2, w3 = (
            w.to_local() if hasattr(w, "to_local") else w for w in (self.w1_EFD, self.w2_EDF, self.w3_EFD)
        )
        x = x_RD.to(w1.dtype)
        h_RF = F.silu(torch._grouped_mm(x, w1.transpose(-2, -1), offs=offsets_E))
        h_RF = h_RF * torch._grouped_mm(x, w3.transpose(-2, -1), offs=offsets_E)
        return torch._grouped_mm(h_RF, w2.transpose(-2, -1), offs=offsets_E).type_as(x_RD)


@override(
    target=GroupedExperts.Config, exact=True, description="grouped experts in the parameters' dtype (CPU)"
)
def param_dtype_experts(cfg: GroupedExperts.Config) -> ParamDtypeGroupedExperts.Config:
    return derive(cfg, ParamDtypeGroupedExperts.Config)


@contextlib.contextmanager
def float32_experts(model: torch.nn.Module):
    """Within: every routed expert of ``model`` computes in float32, whatever the run's precision
    (the export check's probe and the samples, ``rank/float32_forward.py``).

    - torchtitan's ``GroupedExperts`` casts to bfloat16 in its ``forward``; each instance is given
      this module's forward (the same grouped GEMMs in the weights' dtype, float32 within the
      probe) as an instance attribute, removed on exit;
    - expert LoRA's subclasses of it (``models/expert_lora.py``) read an ``in_param_dtype`` flag;
    - ``BlockwiseRoutedExperts`` (model=nki_moe) computes in ``model.moe_compute_dtype``, bfloat16
      on Neuron or with bfloat16 parameters; its ``compute_dtype`` is float32 within.
    """
    from qwen3_trainium.models.overrides.blockwise_experts import BlockwiseRoutedExperts

    swapped, flagged, blockwise = [], [], []
    for module in model.modules():
        if type(module) is GroupedExperts:
            module.forward = types.MethodType(ParamDtypeGroupedExperts.forward, module)
            swapped.append(module)
        elif getattr(module, "lora_parts", None) and isinstance(module, GroupedExperts):
            # expert LoRA's grouped experts (models/expert_lora.py) compute in the weights' dtype
            # while this instance flag is set
            module.in_param_dtype = True
            flagged.append(module)
        elif isinstance(module, BlockwiseRoutedExperts):
            blockwise.append((module, module.compute_dtype))
            module.compute_dtype = "float32"
    try:
        yield
    finally:
        for module in swapped:
            del module.forward
        for module in flagged:
            del module.in_param_dtype
        for module, dtype in blockwise:
            module.compute_dtype = dtype
