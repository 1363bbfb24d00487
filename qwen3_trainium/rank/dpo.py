"""The trainer side of ``objective=dpo`` (docs/dpo.md). Being built (issue 41): with
``config.dpo.enable`` False, as for every other objective, it changes nothing."""

from __future__ import annotations


class DPOObjective:
    """Mixin for a torchtitan ``Trainer``: the DPO step (``config.dpo``)."""
