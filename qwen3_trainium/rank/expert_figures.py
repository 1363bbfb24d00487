"""The ``moe/*`` figures of expert load (docs/expert_load.md), from a ``[layers, experts]`` table
of routed (token, expert) assignments, and the ``expert_load.json`` record the end-of-run heatmap is
drawn from. Plain arithmetic on host tensors: no collectives, no torchtitan."""

from __future__ import annotations

import json
import math
import os

import torch

from qwen3_trainium.shared.expert_load_file import LOAD_NAME

MAX_OVER_MEAN = "moe/load_max_over_mean"
ENTROPY = "moe/load_entropy"
ZERO_TOKENS = "moe/experts_zero_tokens"
ASSIGNMENTS = "moe/assignments_per_layer"


def figures(counts: torch.Tensor) -> dict[str, float]:
    """The ``moe/*`` figures of ``counts [L, E]`` (assignments since the previous log step).

    ``load_max_over_mean``: the worst layer's busiest expert over that layer's mean (1: even,
    E: one expert took everything); ``load_entropy``: mean over layers of the routing entropy
    divided by log E (1: even, 0: one expert); ``experts_zero_tokens``: (layer, expert) pairs
    that received nothing; ``assignments_per_layer``: the assignments of one layer (top_k times
    the tokens routed, padding included, over all ranks), the mean over layers."""
    counts = counts.to(torch.float64)
    per_layer = counts.sum(dim=1)
    used = per_layer > 0  # a layer that saw no token (no step in the window) has no shape
    num_experts = counts.shape[1]
    out = {ZERO_TOKENS: float((counts == 0).sum()), ASSIGNMENTS: float(per_layer.mean())}
    if not bool(used.any()):
        return out
    loads = counts[used]
    share = loads / loads.sum(dim=1, keepdim=True)
    out[MAX_OVER_MEAN] = float((share.max(dim=1).values * num_experts).max())
    if num_experts > 1:
        entropy = -(share * share.clamp_min(1e-300).log()).sum(dim=1) / math.log(num_experts)
        out[ENTROPY] = float(entropy.mean())
    return out


def record(totals: torch.Tensor, layers: list[int], top_k: int, first_step: int, step: int) -> dict:
    """``expert_load.json``: the run's assignments per (layer, expert), and what they cover."""
    return {
        "layers": layers,
        "num_experts": int(totals.shape[1]),
        "top_k": top_k,
        "first_step": first_step,
        "step": step,
        "tokens_per_expert": [[round(float(v)) for v in row] for row in totals],
        "counts": "token-expert assignments summed over the ranks, padding included,"
        " steps first_step..step of the process that wrote this file",
    }


def write_record(run_dir: str, data: dict) -> str:
    """Write ``<run_dir>/expert_load.json`` whole, then rename it into place."""
    path = os.path.join(run_dir, LOAD_NAME)
    os.makedirs(run_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)
    return path
