"""A user's own torchtitan overrides that break an HF export just after it is written, as a wrong
key map or a wrong q/k/v split would: the launcher's export check must then fail the run
(``tests/rank/test_bf16_gates.py``).

Each factory, given in ``override.imports`` (the hatch for a user's own ``@override`` factories),
swaps the checkpoint manager for a subclass whose ``_save_last_step`` lets the export (and the
ranks' probe, computed from the trained model) be written, then has rank 0 rewrite the export's
safetensors with one change:
- ``swapped_experts``: layer 1's experts 0 and 1, 2 and 3, ... trade their gate, up and down
  projections;
- ``swapped_query_heads``: layer 1's query heads 0 and 1 trade places in ``q_proj``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torchtitan.config import derive, override

from qwen3_trainium.rank.checkpoint import Qwen3CheckpointManager

LAYER = "model.layers.1"


def _swap_experts(tensors: dict, config: dict) -> None:
    """Experts 0 and 1, 2 and 3, ... trade places: every expert a token is routed to is another
    (swapping 0 and 1 alone went unseen where the probe routed no token to either, seen on an
    AVX2-only CPU on 2026-12-07); applied twice, the export is whole again."""
    for pair in range(config["num_experts"] // 2):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            a, b = (f"{LAYER}.mlp.experts.{e}.{proj}.weight" for e in (2 * pair, 2 * pair + 1))
            tensors[a], tensors[b] = tensors[b], tensors[a]


def _swap_query_heads(tensors: dict, config: dict) -> None:
    key, head = f"{LAYER}.self_attn.q_proj.weight", config["head_dim"]
    q = tensors[key]
    tensors[key] = torch.cat([q[head : 2 * head], q[:head], q[2 * head :]]).contiguous()


CHANGES = {"swapped_experts": _swap_experts, "swapped_query_heads": _swap_query_heads}


def rewrite(export_dir: str, change: str) -> None:
    """Apply ``CHANGES[change]`` to the export's tensors, each written back to its own file."""
    with open(os.path.join(export_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(export_dir, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    shards = {name: load_file(os.path.join(export_dir, name)) for name in files}
    tensors = {key: value for shard in shards.values() for key, value in shard.items()}
    CHANGES[change](tensors, config)
    for name, shard in shards.items():
        save_file({key: tensors[key] for key in shard}, os.path.join(export_dir, name), {"format": "pt"})


class BrokenExportCheckpointManager(Qwen3CheckpointManager):
    @dataclass(kw_only=True, slots=True)
    class Config(Qwen3CheckpointManager.Config):
        change: str = ""

    def _save_last_step(self, curr_step: int) -> None:
        super()._save_last_step(curr_step)
        if self.last_save_in_hf and (not dist.is_initialized() or dist.get_rank() == 0):
            rewrite(self._create_checkpoint_id(curr_step), self._export.change)


@override(target=Qwen3CheckpointManager.Config, exact=True, description="test: experts swapped in the export")
def swapped_experts(cfg: Qwen3CheckpointManager.Config) -> BrokenExportCheckpointManager.Config:
    return derive(cfg, BrokenExportCheckpointManager.Config, change="swapped_experts")


@override(
    target=Qwen3CheckpointManager.Config, exact=True, description="test: query heads swapped in the export"
)
def swapped_query_heads(cfg: Qwen3CheckpointManager.Config) -> BrokenExportCheckpointManager.Config:
    return derive(cfg, BrokenExportCheckpointManager.Config, change="swapped_query_heads")
