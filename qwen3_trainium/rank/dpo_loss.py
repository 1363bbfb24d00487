"""The DPO loss math (``objective=dpo``, docs/dpo.md): pure torch, no trainer state.

Every formula is TRL 1.16.0's, ``trl/trainer/dpo_trainer.py`` ``DPOTrainer._compute_loss``
(lines 1350-1528), with the default ``f_divergence_type="reverse_kl"``: the scores are the plain
log-ratios, the log-probs are SUMS over a side's completion tokens, only ``ipo`` and
``sigmoid_norm`` divide the log-ratios by the completion token counts, ``label_smoothing`` is read
by ``robust`` and ``exo_pair`` only, and several types combine as ``sum(weight * loss)``. The
metrics (lines 1582-1601) use ``beta * log-ratio`` for every type, accuracies with a strict ``>``.

``DPOTokenLoss`` is the inner loss of torchtitan's ``ChunkedLossWrapper`` for the step's second
pass (``rank/dpo.py``): the sum over tokens of a given per-token weight times the token's
log-prob, whose gradient is the DPO loss's once the weights are dL/d(side sums).

Fixed shapes throughout (index buffers, ``torch.where``; no ``.item()``, no boolean indexing), so
that FakeTensor tracing (memory=trace) and compile see no data-dependent shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torchtitan.components.loss import BaseLoss, compute_logprobs
from torchtitan.config import CompileConfig

# The step's metrics, TRL's names (dpo_trainer.py:1582-1601), in the order metric_sums adds them
METRIC_NAMES = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)


def segment_sums(values: torch.Tensor, segment: torch.Tensor, n: int) -> torch.Tensor:
    """``out[b, k] = sum of values[b, t] over t with segment[b, t] == k`` for k < n: [B, L] -> [B, n].
    Positions with a negative segment land in a spare slot that is dropped."""
    index = torch.where(segment >= 0, segment, n).long()
    kept = torch.where(segment >= 0, values, torch.zeros_like(values))
    out = values.new_zeros(values.shape[0], n + 1)
    return out.scatter_add(1, index, kept)[:, :n]


class PairSums(NamedTuple):
    """Per-pair sums, each of one shape (e.g. [B, P]): the policy's and the reference's summed
    completion log-probs of each side, and each side's completion token count."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    ref_chosen: torch.Tensor
    ref_rejected: torch.Tensor
    n_chosen: torch.Tensor
    n_rejected: torch.Tensor

    @classmethod
    def from_sides(cls, policy: torch.Tensor, reference: torch.Tensor, counts: torch.Tensor) -> PairSums:
        """From [..., 2P] side tensors laid out chosen at 2j, rejected at 2j + 1."""
        chosen, rejected = policy[..., 0::2], policy[..., 1::2]
        ref_chosen, ref_rejected = reference[..., 0::2], reference[..., 1::2]
        return cls(chosen, rejected, ref_chosen, ref_rejected, counts[..., 0::2], counts[..., 1::2])


@dataclass(frozen=True, slots=True)
class LossParams:
    beta: float = 0.1
    label_smoothing: float = 0.0  # robust and exo_pair only (TRL 1.16.0)
    discopop_tau: float = 0.05


def _delta(s: PairSums) -> torch.Tensor:
    return (s.chosen - s.ref_chosen) - (s.rejected - s.ref_rejected)


def _normalised_delta(s: PairSums) -> torch.Tensor:
    """ipo and sigmoid_norm: each log-ratio over its side's token count (clamped at 1, as TRL)."""
    chosen = (s.chosen - s.ref_chosen) / s.n_chosen.clamp(min=1.0)
    return chosen - (s.rejected - s.ref_rejected) / s.n_rejected.clamp(min=1.0)


def _sigmoid(s, p):
    return -F.logsigmoid(p.beta * _delta(s))


def _hinge(s, p):
    return torch.relu(1 - p.beta * _delta(s))


def _ipo(s, p):
    return (_normalised_delta(s) - 1 / (2 * p.beta)) ** 2


def _exo_pair(s, p):
    bd = p.beta * _delta(s)
    eps = bd.new_tensor(p.label_smoothing)
    chosen_term = torch.sigmoid(bd) * (F.logsigmoid(bd) - torch.log1p(-eps))
    return chosen_term + torch.sigmoid(-bd) * (F.logsigmoid(-bd) - torch.log(eps))


def _nca_pair(s, p):
    rc, rr = p.beta * (s.chosen - s.ref_chosen), p.beta * (s.rejected - s.ref_rejected)
    return -F.logsigmoid(rc) - 0.5 * F.logsigmoid(-rc) - 0.5 * F.logsigmoid(-rr)


def _robust(s, p):
    bd, eps = p.beta * _delta(s), p.label_smoothing
    return (-(1 - eps) * F.logsigmoid(bd) + eps * F.logsigmoid(-bd)) / (1 - 2 * eps)


def _bco_pair(s, p):
    rc, rr = p.beta * (s.chosen - s.ref_chosen), p.beta * (s.rejected - s.ref_rejected)
    return -F.logsigmoid(rc) - F.logsigmoid(-rr)


def _sppo_hard(s, p):
    return (s.chosen - s.ref_chosen - 0.5 / p.beta) ** 2 + (s.rejected - s.ref_rejected + 0.5 / p.beta) ** 2


def _apo_zero(s, p):
    return (
        1
        - torch.sigmoid(p.beta * (s.chosen - s.ref_chosen))
        + torch.sigmoid(p.beta * (s.rejected - s.ref_rejected))
    )


def _apo_down(s, p):
    return torch.sigmoid(p.beta * (s.chosen - s.ref_chosen)) + 1 - torch.sigmoid(p.beta * _delta(s))


def _discopop(s, p):
    logits = p.beta * _delta(s)
    mix = torch.sigmoid(logits / p.discopop_tau)
    return -F.logsigmoid(logits) * (1 - mix) + torch.exp(-logits) * mix


def _sigmoid_norm(s, p):
    return -F.logsigmoid(p.beta * _normalised_delta(s))


# choices.DPOLoss value -> per-pair loss (dpo_trainer.py line of TRL 1.16.0's branch)
LOSSES: dict[str, Callable[[PairSums, LossParams], torch.Tensor]] = {
    "sigmoid": _sigmoid,  # :1387
    "hinge": _hinge,  # :1390
    "ipo": _ipo,  # :1393-1404
    "exo_pair": _exo_pair,  # :1406-1417
    "nca_pair": _nca_pair,  # :1419-1426
    "robust": _robust,  # :1428-1431
    "bco_pair": _bco_pair,  # :1433-1436
    "sppo_hard": _sppo_hard,  # :1438-1445
    "apo_zero": _apo_zero,  # :1467-1473
    "apo_down": _apo_down,  # :1475-1481
    "discopop": _discopop,  # :1483-1493
    "sigmoid_norm": _sigmoid_norm,  # :1504-1509
}


def pair_losses(
    sums: PairSums, params: LossParams, loss_types: list[str], loss_weights: list[float]
) -> torch.Tensor:
    """Each pair's loss, ``sum over types of weight * loss``: TRL's batch loss is the mean of this
    over the micro-batch's pairs (``loss += per_sequence_loss.mean() * loss_weight``, :1528)."""
    if len(loss_types) != len(loss_weights):
        raise ValueError(f"{len(loss_types)} loss types but {len(loss_weights)} weights")
    total = None
    for kind, weight in zip(loss_types, loss_weights, strict=True):
        term = LOSSES[kind](sums, params) * weight
        total = term if total is None else total + term
    return total


def masked_loss_sum(losses: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The sum of the real pairs' losses (``valid``: the pair slot holds a pair); an empty slot's
    loss (finite or not) gets neither value nor gradient."""
    return torch.where(valid, losses, torch.zeros_like(losses)).sum()


def metric_sums(sums: PairSums, valid: torch.Tensor, beta: float) -> torch.Tensor:
    """float64 [7]: the METRIC_NAMES sums over the real pairs, then their count (a mean is a sum
    over the step's pairs of every micro-batch and rank, over the count)."""
    with torch.no_grad():
        chosen = beta * (sums.chosen - sums.ref_chosen)  # float32, as TRL's rewards
        rejected = beta * (sums.rejected - sums.ref_rejected)
        per_pair = (
            chosen,
            rejected,
            (chosen > rejected).float(),
            chosen - rejected,
            sums.chosen,
            sums.rejected,
        )
        kept = [torch.where(valid, x, torch.zeros_like(x)).double().sum() for x in per_pair]
        return torch.stack([*kept, valid.double().sum()])


def metric_means(totals: torch.Tensor) -> dict[str, float]:
    """METRIC_NAMES -> the mean over the pairs, from (possibly all-reduced) metric_sums."""
    values = totals.tolist()
    count = values[-1]
    return {
        name: (value / count if count else math.nan)
        for name, value in zip(METRIC_NAMES, values[:-1], strict=True)
    }


def weighted_logprob_sum(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``-sum_t weights[t] * log p(labels[t])`` in float32 (``compute_logprobs``: float32, 0 at
    label -100, TP vocab shards gathered)."""
    return -(weights.float() * compute_logprobs(logits, labels)).sum()


class DPOTokenLoss(BaseLoss):
    """The inner loss of ``ChunkedLossWrapper`` under objective=dpo: the wrapper chunks the
    per-token ``weights`` (a loss input) along the sequence as it chunks the labels
    (``torchtitan/components/loss.py`` ``ChunkedLossWrapper.__call__``). No token normalisation:
    the weights carry the scale."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        pass

    def __init__(self, config: Config, *, compile_config: CompileConfig | None = None):
        self.fn = weighted_logprob_sum
        self._maybe_compile(compile_config)

    def __call__(
        self,
        pred: torch.Tensor,
        labels: torch.Tensor,
        global_valid_tokens: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weights = kwargs.get("weights")
        if weights is None:
            raise ValueError("DPOTokenLoss needs per-token weights (objective=dpo's step passes them)")
        return self.fn(pred, labels, weights), {}


def loss_and_side_weights(
    policy: torch.Tensor,
    reference: torch.Tensor,
    counts: torch.Tensor,
    valid: torch.Tensor,
    params: LossParams,
    loss_types: list[str],
    loss_weights: list[float],
    global_pairs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The micro-batch's share of the step's DPO loss, ``sum of its pairs' losses / global_pairs``,
    and ``-dL/d(policy)``: [B, 2P] side tensors (chosen at 2j, rejected at 2j + 1), ``valid``
    [B, P]. The weights are the second pass's per-token weights: the gradient of
    ``-sum_t w_t log p_t`` is then exactly ``dL/dtheta``, since L depends on theta only through the
    side sums. The gradient is taken on a detached copy: nothing flows into the model here."""
    leaf = policy.detach().requires_grad_()
    with torch.enable_grad():
        losses = pair_losses(PairSums.from_sides(leaf, reference, counts), params, loss_types, loss_weights)
        loss = masked_loss_sum(losses, valid) / global_pairs
        (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), -grad
