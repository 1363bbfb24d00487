"""Expert LoRA (``models/expert_lora.py``) out of the run: PEFT's ``target_parameters`` keys and
layout, the names in ``adapter_config.json``, and the merge into the base experts.

PEFT 0.21.2's ``lora.ParamWrapper`` on a 3-D parameter ``[E, out, in]`` (``peft/tuners/lora/layer.py``,
``get_delta_weight``) holds ``lora_A.weight [E*r, in]`` with rows expert-major (row ``e*r + j``) and
``lora_B.weight [out, E*r]`` with columns rank-major (column ``j*E + e``); the delta of expert e is
``alpha/r * B_e @ A_e`` with ``A_e[j] = A[e*r + j]`` and ``B_e[:, j] = B[:, j*E + e]``. Several
targeted parameters of one module are nested wrappers in registration order: Transformers'
``Qwen3MoeExperts`` registers ``gate_up_proj`` first, so with ``down_proj`` also targeted the
gate_up adapter is the inner one, ``mlp.experts.base_layer.lora_*`` (PEFT's own v4->v5 conversion
says so, ``peft/utils/transformers_weight_conversion.py``), and down's is ``mlp.experts.lora_*``.
"""

from __future__ import annotations

import re

import torch

from qwen3_trainium.models.expert_lora_blockwise import fused_deltas
from qwen3_trainium.models.expert_lora_parts import DOWN, EXPERT_TARGETS, GATE_UP

PARAM_NAMES = {GATE_UP: "mlp.experts.gate_up_proj", DOWN: "mlp.experts.down_proj"}


def is_moe(model_config) -> bool:
    from torchtitan.models.common.moe import RoutedExperts

    return any(True for _ in model_config.traverse(RoutedExperts.Config, recurse=True))


def moe_targets(model_config) -> list[str]:
    """The HF names that adapt a MoE model's experts (none on a dense model)."""
    return list(EXPERT_TARGETS) if is_moe(model_config) else []


def expert_parts(targets) -> tuple[str, ...]:
    """The experts' adapted parameters for HF target names: ``gate_up`` needs both of
    ``gate_proj`` and ``up_proj`` (pre-flight refuses one alone), ``down`` needs ``down_proj``."""
    parts = (GATE_UP,) if {"gate_proj", "up_proj"} <= set(targets) else ()
    return parts + ((DOWN,) if "down_proj" in targets else ())


def target_parameters(targets) -> list[str]:
    """``adapter_config.json``'s ``target_parameters`` of a MoE model."""
    return [PARAM_NAMES[p] for p in expert_parts(targets)]


def expert_lora_modules(model):
    """(layer index, experts module) of every LoRA-adapted experts module."""
    found = []
    for name, module in model.named_modules():
        if getattr(module, "lora_parts", None):
            found.append((int(re.search(r"layers\.(\d+)\.", name)[1]), module))
    return found


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().cpu()


def peft_layout(a_Erin: torch.Tensor, b_Eout_r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ours (``A [E, r, in]``, ``B [E, out, r]``) -> PEFT's (``[E*r, in]``, ``[out, r*E]``)."""
    experts, rank, width = a_Erin.shape
    b = b_Eout_r.permute(1, 2, 0).reshape(b_Eout_r.shape[1], rank * experts)  # column j*E + e
    return a_Erin.reshape(experts * rank, width).contiguous(), b.contiguous()


def peft_expert_tensors(model) -> dict:
    """The expert adapters under PEFT's keys, float32 (every rank gathers; FSDP shards dim 0)."""
    out = {}
    for layer, experts in expert_lora_modules(model):
        stem = f"base_model.model.model.layers.{layer}.mlp.experts"
        inner = ".base_layer" if DOWN in experts.lora_parts else ""
        for part, key in ((GATE_UP, stem + inner), (DOWN, stem)):
            if part in experts.lora_parts:
                a, b = peft_layout(
                    _full(getattr(experts, f"lora_a_{part}")), _full(getattr(experts, f"lora_b_{part}"))
                )
                out[f"{key}.lora_A.weight"], out[f"{key}.lora_B.weight"] = a, b
    return out


def _add_(param: torch.Tensor, delta: torch.Tensor) -> None:
    """``param += delta`` for a plain or sharded parameter (``delta`` is the full tensor)."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        delta = distribute_tensor(delta.to(param.device), param.device_mesh, param.placements)
    param.add_(delta.to(device=param.device, dtype=param.dtype))


def merge_experts_(model) -> int:
    """Fold every expert adapter into its experts (``W[e] += alpha/r * B_e @ A_e`` in float32)
    and zero its B; the number of experts modules merged. One layer's full delta exists at a time."""
    count = 0
    with torch.no_grad():
        for _, experts in expert_lora_modules(model):
            names = ("lora_a_gate_up", "lora_b_gate_up", "lora_a_down", "lora_b_down")
            adapters = [_full(getattr(experts, n)) if hasattr(experts, n) else None for n in names]
            gate_up, down = fused_deltas(experts, *adapters)  # [E, D, 2, F], [E, F, D]
            if hasattr(experts, "gate_up_ED2F"):  # model=nki_moe: the kernel's layout
                pairs = [(experts.gate_up_ED2F, gate_up), (experts.down_EFD, down)]
            else:  # torchtitan's w1 / w3 [E, F, D], w2 [E, D, F]
                w1, w3 = (None, None) if gate_up is None else gate_up.permute(2, 0, 3, 1).unbind(0)
                pairs = [(experts.w1_EFD, w1), (experts.w3_EFD, w3)]
                pairs.append((experts.w2_EDF, None if down is None else down.transpose(1, 2)))
            for param, delta in pairs:
                if delta is not None:
                    _add_(param, delta.contiguous())
            for part in experts.lora_parts:
                getattr(experts, f"lora_b_{part}").zero_()
            count += 1
    return count
