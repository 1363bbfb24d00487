"""Expert load you can see (docs/moe.md): tokens per expert of every MoE layer, summed over the
ranks, as ``moe/*`` figures in metrics.jsonl, W&B and TensorBoard, a warning for idle experts,
and the totals the end-of-run heatmap is drawn from.

Being built (issue 40): for now the mixin changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class ExpertLoadConfig:
    """``tracking.expert_idle_warn_steps`` (0: no warning)."""

    idle_warn_steps: int = 100


class ExpertLoad:
    """Mixin for a torchtitan ``Trainer``: per-expert load figures of a MoE model."""
