"""objective=dpo's loss math (``rank/dpo_loss.py``): every loss type against a hand formula per
pair (the table of TRL 1.16.0's ``_compute_loss``, typed out in scalar ``math``) and against TRL
itself with injected reference log-probs; the segment sums against a loop; the loss's side
weights against finite differences of the hand loss; the metrics.jsonl names."""

from __future__ import annotations

import math

import pytest
import torch
from support import dpo_trl

from qwen3_trainium.config.choices import DPOLoss
from qwen3_trainium.data import assets
from qwen3_trainium.rank import metrics
from qwen3_trainium.rank.dpo_loss import (
    LossParams,
    PairSums,
    loss_and_side_weights,
    metric_means,
    metric_sums,
    pair_losses,
    segment_sums,
)

BETA, EPS, TAU = 0.1, 0.2, 0.05
ALL = [kind.value for kind in DPOLoss]


def _logsig(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def hand(kind: str, pc, pr, rc, rr, nc, nr, beta=BETA, eps=EPS, tau=TAU) -> float:
    """One pair's loss, from the formulas of the research table (issue 41, TRL 1.16.0)."""
    cl, rl = pc - rc, pr - rr
    d = cl - rl
    norm = cl / max(nc, 1) - rl / max(nr, 1)
    formulas = {
        "sigmoid": lambda: -_logsig(beta * d),  # label smoothing is NOT read (TRL 1.16.0)
        "hinge": lambda: max(0.0, 1 - beta * d),
        "ipo": lambda: (norm - 1 / (2 * beta)) ** 2,
        "exo_pair": lambda: (
            _sig(beta * d) * (_logsig(beta * d) - math.log(1 - eps))
            + _sig(-beta * d) * (_logsig(-beta * d) - math.log(eps))
        ),
        "nca_pair": lambda: -_logsig(beta * cl) - 0.5 * _logsig(-beta * cl) - 0.5 * _logsig(-beta * rl),
        "robust": lambda: (-(1 - eps) * _logsig(beta * d) + eps * _logsig(-beta * d)) / (1 - 2 * eps),
        "bco_pair": lambda: -_logsig(beta * cl) - _logsig(-beta * rl),
        "sppo_hard": lambda: (cl - 0.5 / beta) ** 2 + (rl + 0.5 / beta) ** 2,
        "apo_zero": lambda: 1 - _sig(beta * cl) + _sig(beta * rl),
        "apo_down": lambda: _sig(beta * cl) + 1 - _sig(beta * d),
        "discopop": lambda: (
            -_logsig(beta * d) * (1 - _sig(beta * d / tau)) + math.exp(-beta * d) * _sig(beta * d / tau)
        ),
        "sigmoid_norm": lambda: -_logsig(beta * norm),
    }
    return formulas[kind]()


def _random_sums(shape=(2, 5)) -> PairSums:
    g = torch.Generator().manual_seed(3)
    logps = [-(20 + 40 * torch.rand(shape, generator=g, dtype=torch.float64)) for _ in range(4)]
    counts = [torch.randint(1, 40, shape, generator=g).double() for _ in range(2)]
    return PairSums(*logps, *counts)


@pytest.mark.parametrize("kind", ALL)
def test_every_loss_type_equals_its_hand_formula(kind):
    sums = _random_sums()
    ours = pair_losses(sums, LossParams(beta=BETA, label_smoothing=EPS, discopop_tau=TAU), [kind], [1.0])
    flat = [t.flatten().tolist() for t in sums]
    expected = torch.tensor([hand(kind, *pair) for pair in zip(*flat, strict=True)], dtype=torch.float64)
    torch.testing.assert_close(ours.flatten(), expected, rtol=1e-12, atol=1e-12)


def test_types_combine_as_the_weighted_sum_of_their_losses():
    sums, params = _random_sums(), LossParams(beta=BETA, label_smoothing=EPS)
    mixed = pair_losses(sums, params, ["sigmoid", "bco_pair", "ipo"], [0.5, 0.3, 2.0])
    flat = list(zip(*[t.flatten().tolist() for t in sums], strict=True))
    expected = [0.5 * hand("sigmoid", *p) + 0.3 * hand("bco_pair", *p) + 2.0 * hand("ipo", *p) for p in flat]
    torch.testing.assert_close(
        mixed.flatten(), torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12
    )


def test_segment_sums_equal_a_loop():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(3, 40, generator=g, dtype=torch.float64)
    segment = torch.randint(-1, 6, (3, 40), generator=g)
    expected = torch.zeros(3, 6, dtype=torch.float64)
    for b in range(3):
        for t in range(40):
            if segment[b, t] >= 0:
                expected[b, segment[b, t]] += values[b, t]
    torch.testing.assert_close(segment_sums(values, segment, 6), expected, rtol=0, atol=1e-12)


def test_the_loss_is_the_real_pairs_sum_over_the_global_count_and_its_weights_its_gradient():
    """Empty pair slots (pairs < 0) add neither loss nor weight; the weights are -dL/dsums,
    checked by central differences of the hand loss (float64)."""
    sums = _random_sums((1, 4))
    policy = torch.stack([sums.chosen, sums.rejected], -1).flatten(-2)  # chosen at 2j, rejected at 2j + 1
    reference = torch.stack([sums.ref_chosen, sums.ref_rejected], -1).flatten(-2)
    counts = torch.stack([sums.n_chosen, sums.n_rejected], -1).flatten(-2)
    valid = torch.tensor([[True, True, True, False]])
    params, kinds = LossParams(beta=BETA), ["sigmoid", "ipo"]
    loss, weights = loss_and_side_weights(policy, reference, counts, valid, params, kinds, [1.0, 1.0], 7.0)

    def hand_loss(p: torch.Tensor) -> float:
        total = 0.0
        for j in range(3):  # the real pairs only
            pair = [float(t[0, 2 * j + side]) for t in (p, reference, counts) for side in (0, 1)]
            pc, pr, rc, rr, nc, nr = pair
            total += sum(hand(k, pc, pr, rc, rr, nc, nr) for k in kinds)
        return total / 7.0

    assert loss.item() == pytest.approx(hand_loss(policy), rel=1e-12)
    h = 1e-6
    for i in range(policy.shape[1]):
        up, down = policy.clone(), policy.clone()
        up[0, i] += h
        down[0, i] -= h
        numeric = (hand_loss(up) - hand_loss(down)) / (2 * h)
        assert -weights[0, i].item() == pytest.approx(numeric, rel=1e-5, abs=1e-9)
    assert torch.equal(weights[0, 6:], torch.zeros(2, dtype=weights.dtype)), "an empty slot has no weight"


def test_metrics_are_trls_means_over_the_real_pairs_with_strict_accuracy():
    chosen, rejected = torch.tensor([[-10.0, -20.0, -5.0]]), torch.tensor([[-12.0, -18.0, -99.0]])
    ref_chosen, ref_rejected = torch.tensor([[-11.0, -20.0, -5.0]]), torch.tensor([[-12.0, -19.0, -99.0]])
    counts = torch.tensor([[3.0, 4.0, 1.0]])
    sums = PairSums(chosen, rejected, ref_chosen, ref_rejected, counts, counts)
    means = metric_means(metric_sums(sums, torch.tensor([[True, True, False]]), beta=0.5))
    # pair 0: rewards 0.5, 0.0 (accurate); pair 1: rewards 0.0, 0.5 (not); the third is empty
    expected = {
        "rewards/chosen": 0.25,
        "rewards/rejected": 0.25,
        "rewards/accuracies": 0.5,
        "rewards/margins": 0.0,
    }
    expected |= {"logps/chosen": -15.0, "logps/rejected": -15.0}
    assert means == pytest.approx(expected)
    tie = PairSums(*(torch.tensor([[v]]) for v in (-1.0, -1.0, -1.0, -1.0, 1.0, 1.0)))
    assert metric_means(metric_sums(tie, torch.tensor([[True]]), 0.1))["rewards/accuracies"] == 0.0


def test_metrics_jsonl_names_the_dpo_figures_with_underscores():
    assert metrics.jsonl_key("rewards/accuracies") == "rewards_accuracies"
    assert metrics.jsonl_key("logps/chosen") == "logps_chosen"
    assert metrics.jsonl_key("moe/aux_loss") == "moe_aux_loss"


@pytest.fixture(scope="module")
def trl_tiny(tmp_path_factory):
    pytest.importorskip("trl")
    tiny = assets.ensure_hf_model()
    policy, ref = dpo_trl.load(tiny, perturb=True), dpo_trl.load(tiny)
    return dpo_trl.trainer(policy, ref, tiny, tmp_path_factory.mktemp("trl"))


def _plain_sums(model, batch):
    """Completion log-prob sums of TRL's padded batch by plain log_softmax (not TRL's fused head)."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["completion_mask"][:, 1:]
    return (logp * mask).sum(1).chunk(2), mask.sum(1).float().chunk(2)


@pytest.mark.parametrize("kind", ALL)
def test_every_loss_type_equals_trl_with_an_injected_reference(trl_tiny, kind):
    """TRL's precomputed-reference path with reference sums of our choosing against our
    pair_losses on log-prob sums computed outside TRL. rtol 1e-5: two float32 computations of
    sums near -150 differ by up to ~3e-5 (research §2.3)."""
    tr = trl_tiny
    dpo_trl.configure(tr, kind)
    ref = (torch.tensor([-160.0, -141.0, -157.0]), torch.tensor([-150.0, -205.0, -157.5]))
    loss, logged, _ = dpo_trl.step(tr, ref_logps=ref)
    batch = tr.data_collator([tr.train_dataset[i] for i in range(len(dpo_trl.PAIRS))])
    (pc, pr), (nc, nr) = _plain_sums(tr.model, batch)
    sums = PairSums(pc, pr, *ref, nc, nr)
    params = LossParams(beta=dpo_trl.BETA, label_smoothing=dpo_trl.SMOOTHING.get(kind, 0.0))
    ours = pair_losses(sums, params, [kind], [1.0]).mean()
    torch.testing.assert_close(ours, torch.tensor(loss), rtol=1e-5, atol=1e-5)
    means = metric_means(metric_sums(sums, torch.ones(3, dtype=torch.bool), dpo_trl.BETA))
    for name, value in means.items():
        torch.testing.assert_close(torch.tensor(value), torch.tensor(logged[name]), rtol=1e-5, atol=1e-5)


def test_held_out_dpo_figures_reach_metrics_jsonl_and_no_perplexity_is_made_of_a_dpo_loss(monkeypatch):
    """eval=on with objective=dpo (rank/dpo_validator.py): validation_metrics/rewards/* are written
    as val_rewards_*, and exp(held-out DPO loss) is not logged as a perplexity."""
    from torchtitan.components.metrics import MetricsProcessor

    assert metrics.jsonl_key("validation_metrics/rewards/accuracies") == "val_rewards_accuracies"
    assert metrics.jsonl_key("validation_metrics/logps/chosen") == "val_logps_chosen"
    seen = []
    monkeypatch.setattr(
        MetricsProcessor, "log_validation", lambda self, **kw: seen.append(kw["extra_metrics"])
    )
    processor = object.__new__(metrics.JsonlMetricsProcessor)
    processor.log_validation(0.5, 10, {"validation_metrics/rewards/accuracies": 1.0})
    processor.log_validation(2.0, 10, {})
    assert metrics.VAL_PERPLEXITY not in seen[0]
    assert seen[1][metrics.VAL_PERPLEXITY] == pytest.approx(math.exp(2.0))
