"""torchtitan's ``Validator``, run every ``eval.freq`` steps and after the last step.

torchtitan validates at step 1 and every ``freq`` steps (``BaseValidator.should_validate``,
``torchtitan/components/validate.py``), so a run whose length is not a multiple of ``freq`` ends
without a held-out figure, and step 1's says nothing about training. This subclass (torchtitan's
``Configurable`` pattern: ``Config.build()`` makes it) validates at multiples of ``freq`` and at
``last_step``. Everything else (the held-out dataloader, the loss, logging through the metrics
processor's ``log_validation``) is torchtitan's.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.components.validate import Validator


class HeldOutValidator(Validator):
    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):
        last_step: int = 0
        """training.steps: validate after it, whatever freq is."""

    def should_validate(self, step: int) -> bool:
        return step % self.config.freq == 0 or step == self.config.last_step
