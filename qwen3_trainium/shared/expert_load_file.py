"""``expert_load.json``, a MoE run's tokens per (layer, expert) (``rank/expert_load.py`` writes it on
the metrics rank): its name and what the parent reads from it for the heatmap and sweep columns.
Standard library only: the parent reads it without importing torch."""

from __future__ import annotations

import os
from typing import Any

from qwen3_trainium.shared.contract import read_json

LOAD_NAME = "expert_load.json"
HEATMAP_NAME = "expert_load.png"


def read_load(run_dir: str) -> dict[str, Any]:
    """The run's record, or ``{}`` (a dense model, or a run that logged no step)."""
    data = read_json(os.path.join(run_dir, LOAD_NAME))
    return data if data.get("tokens_per_expert") else {}


def shares(data: dict[str, Any]) -> list[list[float]]:
    """Each layer's share of its assignments per expert (a layer that saw none: zeros)."""
    rows = []
    for counts in data["tokens_per_expert"]:
        total = sum(counts)
        rows.append([c / total if total else 0.0 for c in counts])
    return rows


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """Sweep columns: ``max_load``, the worst layer's busiest expert over the layer's mean (1: even)
    over the whole run, and ``zero_experts``, the (layer, expert) pairs that never got a token."""
    if not data:
        return {"max_load": "", "zero_experts": ""}
    worst = max((max(row) * len(row) for row in shares(data) if any(row)), default=0.0)
    zero = sum(1 for counts in data["tokens_per_expert"] for c in counts if c == 0)
    return {"max_load": round(worst, 3), "zero_experts": zero}
