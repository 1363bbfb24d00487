"""Held-out preference metrics for ``objective=dpo`` with ``eval=on``: torchtitan's ``Validator``
(``torchtitan/components/validate.py``, through ``validator.py``'s ``HeldOutValidator``: the same
steps, the same held-out loader config) with the DPO loss in place of cross-entropy.

Every ``eval.freq`` steps and after the last, each rank scores its share of the held-out pairs
(``data/preference/loader.py``, split validation): the policy's per-side completion log-prob
sums (``trainer.dpo_side_sums``, the model in ``eval()`` mode and no grad, so the MoE counts and
ledgers see nothing), the reference's from the held-out table (``dpo_reference.prepare(trainer,
"validation")``, computed at the first step boundary with the training table: later the model
holds trained weights) or, with LoRA's ``adapters_off``, from the same forward with the adapters
switched off (``dpo_logps.adapters_off``). The pair losses and metrics are ``dpo_loss``'s, TRL
1.16.0's formulas; summed over every rank and divided by the held-out pairs they give:

- ``validation_metrics/loss``: the mean DPO loss over the held-out pairs (TRL's ``eval_loss`` is a
  mean of per-batch means: the same when every batch holds as many pairs). The sweep objective
  with eval=on (``val_loss``, ``parent/report.py``) is then the held-out DPO loss;
- ``validation_metrics/rewards/accuracies``, ``.../rewards/margins``, ``.../rewards/chosen``,
  ``.../rewards/rejected``, ``.../logps/chosen``, ``.../logps/rejected``: TRL's eval metrics
  (``eval_rewards/accuracies``, ..., ``DPOTrainer.log``), means over the held-out pairs.

The validator needs the trainer (its ``dpo_side_sums``) and, for ``precompute``, a table made
before step 1: torchtitan builds validators before the checkpoint load, with no trainer, so the
trainer hands itself over at its first step boundary (``bind``, called from ``rank/dpo.py``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torchtitan.tools.logging import logger

from qwen3_trainium.data.preference import PAIR_KEY, SEGMENT_KEY
from qwen3_trainium.rank import dpo_logps, dpo_reference
from qwen3_trainium.rank import dpo_reference_rows as rows
from qwen3_trainium.rank.dpo_loss import (
    METRIC_NAMES,
    LossParams,
    PairSums,
    masked_loss_sum,
    metric_means,
    metric_sums,
    pair_losses,
)
from qwen3_trainium.rank.validator import HeldOutValidator

PREFIX = "validation_metrics/"


def bind(trainer) -> None:
    """At the trainer's first step boundary, after the checkpoint load (``rank/dpo.py``): the
    held-out validator gets the trainer and, with ``reference=precompute``, its reference table."""
    validator = getattr(trainer, "validator", None)
    if trainer.config.validator.enable and isinstance(validator, PreferenceValidator):
        validator.bind(trainer)


def scores(trainer, input_dict: dict, labels: torch.Tensor, reference) -> torch.Tensor:
    """float64 [8] on the host: the batch's summed pair losses, then ``dpo_loss.metric_sums``
    (six sums and the pair count). ``reference``: a ``ReferenceTable``, or None for the model's
    own adapters-off forward."""
    dpo = trainer.config.dpo
    policy = trainer.dpo_side_sums(input_dict, labels)
    pairs = input_dict[PAIR_KEY].to(policy.device)
    if reference is not None:
        ref = reference.lookup(pairs).to(policy.dtype)
    else:
        with dpo_logps.adapters_off(trainer.model_parts[0]):
            ref = trainer.dpo_side_sums(input_dict, labels)
    counts = dpo_logps.side_counts(input_dict[SEGMENT_KEY].to(policy.device), policy.shape[1])
    sums, valid = PairSums.from_sides(policy, ref, counts), pairs >= 0
    params = LossParams(beta=dpo.beta, label_smoothing=dpo.label_smoothing, discopop_tau=dpo.discopop_tau)
    loss = masked_loss_sum(pair_losses(sums, params, dpo.loss_types, dpo.loss_weights), valid)
    return torch.cat([loss.double().reshape(1), metric_sums(sums, valid, dpo.beta)]).cpu()


class PreferenceValidator(HeldOutValidator):
    @dataclass(kw_only=True, slots=True)
    class Config(HeldOutValidator.Config):
        """``eval=on`` with ``objective=dpo`` (``dataloader``: the held-out preference rows)."""

    _trainer = None
    _reference = None  # dpo_reference.ReferenceTable of the held-out split (reference=precompute)

    def bind(self, trainer) -> None:
        self._trainer = trainer
        if trainer.config.dpo.reference == "precompute":
            self._reference = dpo_reference.prepare(trainer, "validation")

    def _batches(self):
        """The held-out batches, as torchtitan's ``Validator.validate`` reads them (``eval.steps``
        of them, or the whole share with steps -1), then padding while another rank has rows."""
        loader = self.dl_config.build(
            dp_world_size=self.dp_world_size,
            dp_rank=self.dp_rank,
            tokenizer=self.tokenizer,
            seq_len=self.seq_len,
            local_batch_size=self.local_batch_size,
        )
        steps = self.config.steps
        mine = loader if steps == -1 else itertools.islice(loader, steps)
        empty = rows.padding(self.local_batch_size, self.seq_len, ())  # held-out rows: no MoE mask
        return rows.lockstep(mine, dpo_reference.host_group(), empty)

    @torch.no_grad()
    def validate(self, model_parts: list, step: int) -> None:
        if self._trainer is None:
            raise RuntimeError("objective=dpo: the held-out validator was not bound to its trainer")
        totals = torch.zeros(8, dtype=torch.float64)
        with rows.eval_mode(model_parts):
            for input_dict, labels in self._batches():
                self.metrics_processor.ntokens_since_last_log += labels.numel()
                totals += scores(self._trainer, input_dict, labels, self._reference)
        group = dpo_reference.host_group()
        if group is not None:  # tensor/context parallel ranks add alike to sums and count
            dist.all_reduce(totals, group=group)
        count = float(totals[-1])
        loss = float(totals[0]) / count if count else float("nan")
        means = metric_means(totals[1:])
        extra = {PREFIX + name: value for name, value in means.items()}
        self.metrics_processor.log_validation(loss=loss, step=step, extra_metrics=extra)
        accuracy = means[METRIC_NAMES[2]]
        logger.info(
            f"validation: DPO loss {loss:.4f}, rewards/accuracies {accuracy:.3f} over {int(count)} held-out pairs"
        )
