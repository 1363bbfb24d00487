"""The dims and parameter counts of a model that the estimate sizes memory from (``estimate.py``
builds one from a torchtitan model config; ``sequence.py`` reads it too). Standard library only:
the parent plans memory without importing torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    params: int
    largest_layer: int
    n_layers: int
    dim: int
    q_dim: int
    kv_dim: int
    ffn: int  # per token: FFN width (dense) or top_k x expert width (MoE)
    n_heads: int
    n_kv_heads: int
    vocab: int
    num_experts: int
    largest_unit: int = 0  # the largest FSDP unit: a layer, the embedding or the output head
    top_k: int = 0
    expert_width: int = 0
    trainable: int = -1  # parameters with gradients and optimizer states (-1: all; peft=lora: the adapters)
    adapters: tuple[tuple[str, int], ...] = ()  # peft=lora: (adapted Linear of a layer, its rank)
    # peft=lora on a MoE's experts: (adapted expert projection, gate_up or down; its rank)
    expert_adapters: tuple[tuple[str, int], ...] = ()

    @property
    def trained(self) -> int:
        return self.params if self.trainable < 0 else self.trainable

    @property
    def head_dim(self) -> int:
        return self.q_dim // self.n_heads
