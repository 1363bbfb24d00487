"""The two layouts of Qwen3-MoE's routed experts, and the one conversion between them.

torchtitan's ``GroupedExperts`` (``model=native``) keeps ``w1_EFD`` / ``w3_EFD [E, F, D]`` (gate,
up) and ``w2_EDF [E, D, F]`` (down); ``model=nki_moe``'s ``FusedExperts``
(``overrides/blockwise_experts.py``) keeps the NKI kernels' layout, ``gate_up_ED2F [E, D, 2, F]``
(index 0 the gate, 1 the up projection) and ``down_EFD [E, F, D]``. Both places that convert call
this module: the HF boundary of ``model=nki_moe`` (a model's state dict, ``FusedExpertsStateDictAdapter``)
and ``python -m qwen3_trainium.convert_experts`` (a whole DCP step: the model's tensors and their
AdamW states).

Keys are flat: any prefix, the parameter's name as a whole dotted component, and anything after it
(an optimizer state's ``.exp_avg``). A value of fewer than 3 dims (AdamW's ``step``) is carried
over under its new name. Converted tensors are contiguous: the HF writer refuses views
(safetensors: "non contiguous tensor"), and torchtitan's adapter slices each expert out of them.
"""

from __future__ import annotations

import re

GATE_UP, DOWN = "gate_up_ED2F", "down_EFD"
TITAN_EXPERTS = ("w1_EFD", "w2_EDF", "w3_EFD")  # torchtitan's GroupedExperts parameters
FUSED, TITAN = "fused", "torchtitan"
_TITAN_KEY = re.compile(r"^(?P<head>(?:.*\.)?)(?P<param>w1_EFD|w2_EDF|w3_EFD)(?P<tail>\..*)?$")
_FUSED_KEY = re.compile(r"^(?P<head>(?:.*\.)?)(?P<param>gate_up_ED2F|down_EFD)(?P<tail>\..*)?$")
# the key each converted key's value comes from (its nested-dict path, in convert_experts)
SOURCE = {GATE_UP: "w1_EFD", DOWN: "w2_EDF", "w1_EFD": GATE_UP, "w3_EFD": GATE_UP, "w2_EDF": DOWN}


def match(key: str):
    """The key's (head, param, tail) match in either layout, or None."""
    return _TITAN_KEY.match(key) or _FUSED_KEY.match(key)


def layout_of(keys) -> str | None:
    """``fused``, ``torchtitan`` or None (no routed experts) from flat keys."""
    for key in keys:
        if _FUSED_KEY.match(key):
            return FUSED
        if _TITAN_KEY.match(key):
            return TITAN
    return None


def _is_expert_tensor(value) -> bool:
    return hasattr(value, "dim") and value.dim() >= 3  # a weight or its AdamW moment, not a step


def to_fused(flat: dict) -> dict:
    """Flat keys in torchtitan's layout -> the fused one (values converted)."""
    import torch

    out = {}
    for key, value in flat.items():
        m = _TITAN_KEY.match(key)
        if not m:
            out[key] = value
            continue
        head, param, tail = m["head"], m["param"], m["tail"] or ""
        if param == "w1_EFD":
            if _is_expert_tensor(value):
                up = flat[f"{head}w3_EFD{tail}"]
                value = torch.stack([value.transpose(1, 2), up.transpose(1, 2)], dim=2).contiguous()
            out[f"{head}{GATE_UP}{tail}"] = value
        elif param == "w2_EDF":
            out[f"{head}{DOWN}{tail}"] = (
                value.transpose(1, 2).contiguous() if _is_expert_tensor(value) else value
            )
    return out


def to_titan(flat: dict) -> dict:
    """Flat keys in the fused layout -> torchtitan's (values converted)."""
    out = {}
    for key, value in flat.items():
        m = _FUSED_KEY.match(key)
        if not m:
            out[key] = value
            continue
        head, param, tail = m["head"], m["param"], m["tail"] or ""
        expert = _is_expert_tensor(value)
        if param == GATE_UP:
            for index, name in enumerate(("w1_EFD", "w3_EFD")):
                part = value[:, :, index, :].transpose(1, 2).contiguous() if expert else value
                out[f"{head}{name}{tail}"] = part
        else:
            out[f"{head}w2_EDF{tail}"] = value.transpose(1, 2).contiguous() if expert else value
    return out
