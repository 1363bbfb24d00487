"""A user's own torchtitan override that breaks a ``peft=lora`` run's PEFT adapter just after it
is written, as a wrong key map would: the launcher's export check (the base with the adapter
folded in, ``parent/export_check.py``) must then fail the run (``tests/rank/test_lora_bf16_gate.py``).

Given in ``override.imports`` (the hatch for a user's own ``@override`` factories), the factory
swaps the checkpoint manager for a subclass whose ``_save_last_step`` lets the adapter (and the
ranks' probe, computed from the trained model) be written, then has rank 0 rewrite
``step-N-adapter/adapter_model.safetensors`` with one change:
- ``swapped_kv_adapters``: layer 1's k_proj and v_proj adapters trade places (A and B), as a key
  map that wrote k_proj's adapter under v_proj's name and v_proj's under k_proj's would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torchtitan.config import derive, override

from qwen3_trainium.models import lora
from qwen3_trainium.rank.checkpoint import Qwen3CheckpointManager

STEM = "base_model.model.model.layers.1.self_attn"


def _swap_kv(tensors: dict) -> None:
    for part in ("lora_A", "lora_B"):
        k, v = (f"{STEM}.{proj}.{part}.weight" for proj in ("k_proj", "v_proj"))
        tensors[k], tensors[v] = tensors[v], tensors[k]


CHANGES = {"swapped_kv_adapters": _swap_kv}


def rewrite(adapter_dir: str, change: str) -> None:
    """Apply ``CHANGES[change]`` to the adapter's tensors and write them back."""
    path = os.path.join(adapter_dir, lora.ADAPTER_WEIGHTS)
    tensors = load_file(path)
    CHANGES[change](tensors)
    save_file(tensors, path, {"format": "pt"})


class BrokenAdapterCheckpointManager(Qwen3CheckpointManager):
    @dataclass(kw_only=True, slots=True)
    class Config(Qwen3CheckpointManager.Config):
        change: str = ""

    def _save_last_step(self, curr_step: int) -> None:
        super()._save_last_step(curr_step)
        if self.last_save_in_hf and self._export.lora and (not dist.is_initialized() or dist.get_rank() == 0):
            rewrite(lora.adapter_dir(self._create_checkpoint_id(curr_step)), self._export.change)


@override(
    target=Qwen3CheckpointManager.Config, exact=True, description="test: k/v adapters swapped in the export"
)
def swapped_kv_adapters(cfg: Qwen3CheckpointManager.Config) -> BrokenAdapterCheckpointManager.Config:
    return derive(cfg, BrokenAdapterCheckpointManager.Config, change="swapped_kv_adapters")
