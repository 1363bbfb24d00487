"""Held-out preference metrics for ``objective=dpo`` with ``eval=on``: torchtitan's ``Validator``
(``torchtitan/components/validate.py``, through ``validator.py``'s ``HeldOutValidator``: the same
steps, the same held-out loader config, the same input processing and validation context) with
the DPO loss in place of cross-entropy.

Every ``eval.freq`` steps and after the last, each rank scores its share of the held-out pairs
(``data/preference/loader.py``, split validation): the policy's per-side completion log-prob
sums (the model in ``eval()`` mode, no grad, so the MoE counts and ledgers see nothing; the
trainer's chunked lm_head and float32 log-probs, ``dpo_logps.side_sums``, as the training step),
and the reference's: from the held-out table (reference=precompute), computed at the trainer's
first step boundary with the training table (``dpo_reference.prepare(trainer, "train")`` calls
``bind``: later the model holds trained weights), or, with LoRA's ``adapters_off``, the same
forward with the adapters switched off (``dpo_logps.adapters_off``). The pair losses and metrics
are ``dpo_loss``'s, TRL 1.16.0's formulas; summed over every rank and divided by the held-out
pairs they give:

- ``validation_metrics/loss``: the mean DPO loss over the held-out pairs (TRL's ``eval_loss`` is a
  mean of per-batch means: the same when every batch holds as many pairs). The sweep objective
  with eval=on (``val_loss``, ``parent/report.py``) is then the held-out DPO loss;
- ``validation_metrics/rewards/accuracies``, ``.../rewards/margins``, ``.../rewards/chosen``,
  ``.../rewards/rejected``, ``.../logps/chosen``, ``.../logps/rejected``: TRL's eval metrics
  (``eval_rewards/accuracies``, ..., ``DPOTrainer.log``), means over the held-out pairs.

The DPO settings (beta, loss types) come from the run's resolved.yaml, which the held-out
loader's config names, as every rank-side builder reads it (``dpo_config.settings``).
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
from qwen3_trainium.rank.dpo_config import DPOSettings
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
    """At the trainer's first step boundary, after the checkpoint load: the held-out reference
    table, when the run validates with a precomputed reference (idempotent)."""
    validator = getattr(trainer, "validator", None)
    if isinstance(validator, PreferenceValidator) and trainer.config.validator.enable:
        validator.bind(trainer)


def pair_scores(dpo: DPOSettings, policy, reference, segment, pairs) -> torch.Tensor:
    """float64 [8] on the host: a batch's summed pair losses, then ``dpo_loss.metric_sums`` (six
    sums and the pair count). ``policy``, ``reference`` [B, 2P] side sums, ``segment`` [B, L],
    ``pairs`` [B, P] (the row contract, ``data/preference/__init__.py``)."""
    counts = dpo_logps.side_counts(segment, policy.shape[1])
    sums, valid = PairSums.from_sides(policy, reference, counts), pairs >= 0
    params = LossParams(beta=dpo.beta, label_smoothing=dpo.label_smoothing, discopop_tau=dpo.discopop_tau)
    loss = masked_loss_sum(pair_losses(sums, params, dpo.loss_types, dpo.loss_weights), valid)
    return torch.cat([loss.double().reshape(1), metric_sums(sums, valid, dpo.beta)]).cpu()


def _device(model) -> torch.device:
    return next(model.parameters()).device


class PreferenceValidator(HeldOutValidator):
    @dataclass(kw_only=True, slots=True)
    class Config(HeldOutValidator.Config):
        """``eval=on`` with ``objective=dpo`` (``dataloader``: the held-out preference rows)."""

    _settings: DPOSettings | None = None
    _reference = None  # dpo_reference.ReferenceTable of the held-out split (reference=precompute)

    def dpo(self) -> DPOSettings:
        if self._settings is None:
            from qwen3_trainium.config import runconfig
            from qwen3_trainium.rank import dpo_config

            path = self.dl_config.config_path
            self._settings = dpo_config.settings(runconfig.load(path), path)
        return self._settings

    def bind(self, trainer) -> None:
        if self.dpo().reference == "precompute" and self._reference is None:
            self._reference = dpo_reference.prepare(trainer, "validation")

    def side_sums(self, model_parts: list, input_dict: dict, labels: torch.Tensor) -> torch.Tensor:
        """float32 [B, 2P]: the model's per-side completion log-prob sums of a held-out batch, as
        torchtitan's ``Validator.validate`` runs its forward (``post_dataloading_process``, the
        validation context), the lm_head applied in chunks as the training step does."""
        batch = {k: v for k, v in input_dict.items() if k not in (SEGMENT_KEY, PAIR_KEY)}
        device = _device(model_parts[0])
        batch = {k: v.to(device) for k, v in batch.items()}
        inputs, labels, extra = self.post_dataloading_process(batch, labels.to(device), model_parts)
        segment, n = input_dict[SEGMENT_KEY].to(device), 2 * input_dict[PAIR_KEY].shape[1]
        with self.validation_context():
            hidden = model_parts[0](inputs, **extra)
            return dpo_logps.side_sums(self.loss_fn, hidden, labels, segment, n)

    def scores(self, model_parts: list, input_dict: dict, labels: torch.Tensor) -> torch.Tensor:
        policy = self.side_sums(model_parts, input_dict, labels)
        pairs = input_dict[PAIR_KEY].to(policy.device)
        if self.dpo().reference == "precompute":
            if self._reference is None:  # dpo_reference.prepare(trainer, "train") binds it
                raise RuntimeError("objective=dpo: no held-out reference table (bind was not called)")
            reference = self._reference.lookup(pairs).to(policy.dtype)
        else:
            with dpo_logps.adapters_off(model_parts[0]):
                reference = self.side_sums(model_parts, input_dict, labels)
        return pair_scores(self.dpo(), policy, reference, input_dict[SEGMENT_KEY].to(policy.device), pairs)

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
        totals = torch.zeros(8, dtype=torch.float64)
        with rows.eval_mode(model_parts):
            for input_dict, labels in self._batches():
                self.metrics_processor.ntokens_since_last_log += labels.numel()
                totals += self.scores(model_parts, input_dict, labels)
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
