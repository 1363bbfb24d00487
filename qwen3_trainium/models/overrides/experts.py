"""torchtitan's grouped experts computed in the parameters' dtype (CPU, float32).

``GroupedExperts.forward`` casts activations and weights to bfloat16 whatever the configured
precision, because CUDA's grouped GEMM wants it. On CPU, where ``mixed_precision_param`` is
float32 (the ``auto`` default there), that made the native MoE the only part of a float32 run
computed in bfloat16: its HF export could not match Transformers' float32 Qwen3-MoE (5.8e-4 max
abs logit diff measured on tiny_moe). ``torch._grouped_mm`` runs float32 on CPU, so this override
keeps the same parameters and the same three grouped GEMMs without the casts.
Activated by ``titan.override_imports`` on CPU with float32 parameters.
"""

from __future__ import annotations

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
