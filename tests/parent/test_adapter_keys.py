"""The export check reads a PEFT adapter only when its keys pair up: one ``lora_A`` and one
``lora_B`` per module, in PEFT's names. Half an adapter, or a key of another shape, fails with the
keys named instead of being left out of the comparison."""

from __future__ import annotations

import pytest
import torch

from qwen3_trainium.parent.export_check import adapter_stems

Q = "base_model.model.model.layers.0.self_attn.q_proj"
V = "base_model.model.model.layers.0.self_attn.v_proj"


def _adapter(*keys: str) -> dict:
    return dict.fromkeys(keys, torch.zeros(1))


def test_paired_keys_give_each_adapted_module_once():
    tensors = _adapter(f"{Q}.lora_A.weight", f"{Q}.lora_B.weight", f"{V}.lora_B.weight", f"{V}.lora_A.weight")
    assert adapter_stems(tensors) == ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"]


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ((f"{Q}.lora_A.weight", f"{Q}.lora_B.weight", f"{V}.lora_B.weight"), "v_proj: lora_B only"),
        ((f"{Q}.lora_A.weight", f"{Q}.lora_B.weight", f"{V}.lora_A.weight"), "v_proj: lora_A only"),
        ((f"{Q}.lora_A.weight", f"{Q}.lora_B.weight", f"{V}.lora_embedding_A"), f"{V}.lora_embedding_A"),
        ((f"{Q}.lora_A.weight", "model.layers.0.self_attn.q_proj.lora_B.weight"), "q_proj: lora_A only"),
    ],
)
def test_half_an_adapter_or_a_stray_key_fails_naming_it(keys, named):
    with pytest.raises(ValueError, match="not one lora_A and one lora_B") as error:
        adapter_stems(_adapter(*keys))
    assert named in str(error.value)
