"""The names every expert-LoRA module shares (``expert_lora.py``, ``expert_lora_blockwise.py``,
``expert_lora_io.py``, ``lora.py``): which Hugging Face targets adapt the experts, the two
adapted parameters, and the adapters' names and shapes (expert dim first, so FSDP shards them
with the experts). Standard library only: pre-flight reads the targets without torch."""

from __future__ import annotations

# HF names that adapt a MoE model's experts (Transformers' gate_up_proj and down_proj parameters)
EXPERT_TARGETS = ("gate_proj", "up_proj", "down_proj")
GATE_UP, DOWN = "gate_up", "down"
ADAPTER_PARAMS = ("lora_a_gate_up", "lora_b_gate_up", "lora_a_down", "lora_b_down")


def local(t):
    """This rank's shard of a tensor: a DTensor's local tensor, else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def adapter_shapes(num_experts: int, dim: int, width: int, rank: int, parts) -> dict[str, tuple]:
    """Name -> shape of the adapters of ``parts`` (``gate_up``, ``down``)."""
    shapes = {}
    if GATE_UP in parts:
        shapes.update(lora_a_gate_up=(num_experts, rank, dim), lora_b_gate_up=(num_experts, 2 * width, rank))
    if DOWN in parts:
        shapes.update(lora_a_down=(num_experts, rank, width), lora_b_down=(num_experts, dim, rank))
    return shapes
