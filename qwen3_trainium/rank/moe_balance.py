"""The trainer side of ``model.moe_balance`` (docs/moe.md): Hugging Face's router
load-balancing loss and the router z-loss, weighted per data-parallel rank and micro-batch.

Being built (issue 40): for now the mixin changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class BalanceConfig:
    """The auxiliary router losses a MoE run adds (0: none)."""

    aux_loss_coef: float = 0.0
    z_loss_coef: float = 0.0


class MoEBalance:
    """Mixin for a torchtitan ``Trainer``: the router's auxiliary losses (``config.moe_balance``)."""
