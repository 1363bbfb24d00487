"""The held-out preference metrics (``rank/dpo_validator.py``) on a fake trainer whose per-side
"log-prob" sums are known from the records alone (Transformers' chat template): the validator's
loss and TRL's metrics against the hand formulas, with a precomputed table and with the
adapters-off reference. Fast: no torchrun."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import resolve
from test_dpo_reference import _completion_sum, _pair, _saved

from qwen3_trainium.rank import dpo_reference
from qwen3_trainium.rank.dpo_validator import PreferenceValidator, bind

BETA = 0.1


def _corpus(folder, n_train: int = 4, n_val: int = 5) -> list[dict]:
    folder.mkdir()
    held = [_pair(100 + i) for i in range(n_val)]
    (folder / "train.jsonl").write_text("".join(json.dumps(_pair(i)) + "\n" for i in range(n_train)))
    (folder / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    return held


class _Adapter(torch.nn.Module):
    """A module as LoRA's: the model's sums follow its ``_lora_scaling``."""

    def __init__(self):
        super().__init__()
        self._lora_scaling = 2.0


class _Trainer:
    """``dpo_side_sums``: each side's summed completion label ids over 1000, times (1 + the adapter
    scale): the policy's with the adapters on (x3), the base's with them off (x1)."""

    def __init__(self, config_path: str, seq_len: int, reference: str):
        dpo = SimpleNamespace(
            beta=BETA,
            loss_types=["sigmoid"],
            loss_weights=[1.0],
            label_smoothing=0.0,
            discopop_tau=0.05,
            reference=reference,
            reference_path="",
            config_path=config_path,
        )
        self.config = SimpleNamespace(dpo=dpo, training=SimpleNamespace(seq_len=seq_len, local_batch_size=2))
        self.config.validator = SimpleNamespace(enable=True)
        self.adapter = _Adapter()
        self.model_parts = [torch.nn.Sequential(self.adapter)]
        self.step = 0

    def dpo_side_sums(self, input_dict, labels):
        from qwen3_trainium.data.preference import PAIR_KEY, SEGMENT_KEY

        assert not self.model_parts[0].training and not torch.is_grad_enabled()
        segment = input_dict[SEGMENT_KEY]
        out = torch.zeros(segment.shape[0], 2 * input_dict[PAIR_KEY].shape[1])
        for b, t in zip(*torch.nonzero(segment >= 0, as_tuple=True), strict=True):
            out[b, segment[b, t]] += float(labels[b, t]) / 1000
        return out * (1 + self.adapter._lora_scaling)


class _Metrics:
    ntokens_since_last_log = 0
    logged: list = []

    def log_validation(self, loss, step, extra_metrics=None):
        self.logged.append((loss, step, dict(extra_metrics)))


def _validator(run, config_path: str) -> PreferenceValidator:
    from torchtitan.config import ParallelismConfig

    from qwen3_trainium.data.preference.loader import PreferenceDataLoader

    config = PreferenceValidator.Config(
        enable=True,
        freq=1,
        steps=-1,
        last_step=1,
        dataloader=PreferenceDataLoader.Config(config_path=config_path, split="validation", infinite=False),
    )
    return config.build(
        parallelism=ParallelismConfig(),
        dp_world_size=1,
        dp_rank=0,
        tokenizer=None,
        parallel_dims=None,
        loss_fn=None,
        validation_context=None,
        metrics_processor=_Metrics(),
        seq_len=run.training.seq_len,
        local_batch_size=2,
    )


def _expected(held: list[dict], tok, policy_scale: float, ref: list[tuple[float, float]]) -> dict:
    """TRL 1.16.0's sigmoid loss and eval metrics by hand (dpo_trainer.py:1387, :1582-1601)."""
    rows = []
    for record, (rc, rr) in zip(held, ref, strict=True):
        pc = policy_scale * _completion_sum(tok, record, "chosen") / 1000
        pr = policy_scale * _completion_sum(tok, record, "rejected") / 1000
        chosen, rejected = BETA * (pc - rc), BETA * (pr - rr)
        loss = math.log1p(math.exp(-(chosen - rejected)))  # -log sigmoid
        rows.append((loss, chosen, rejected, float(chosen > rejected), chosen - rejected, pc, pr))
    means = [sum(col) / len(rows) for col in zip(*rows, strict=True)]
    names = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins")
    return dict(zip(names + ("logps/chosen", "logps/rejected"), means, strict=True))


def _check(logged, want: dict) -> None:
    loss, step, extra = logged
    assert step == 7 and loss == pytest.approx(want["loss"], rel=1e-5)
    for name, value in want.items():
        if name != "loss":
            assert extra[f"validation_metrics/{name}"] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_held_out_dpo_loss_and_metrics_with_the_precomputed_reference(tmp_path):
    from transformers import AutoTokenizer

    held = _corpus(tmp_path / "data")
    run = resolve("objective=dpo", f"data.dataset_path={tmp_path / 'data'}", "eval=on")
    config_path = _saved(run, tmp_path / "run")
    table = dpo_reference.ReferenceTable(
        -torch.arange(5.0) - 60,
        -torch.arange(5.0) * 3 - 50,
        torch.ones(5, dtype=torch.bool),
        run.training.seq_len,
    )
    table.save(dpo_reference.table_path(run, "validation"))  # as the first start wrote it
    trainer = _Trainer(config_path, run.training.seq_len, "precompute")
    trainer.validator = validator = _validator(run, config_path)
    bind(trainer)
    validator.validate(trainer.model_parts, step=7)
    assert trainer.model_parts[0].training  # the mode it had
    tok = AutoTokenizer.from_pretrained(run.data.hf_assets_path)
    ref = [(float(table.chosen[i]), float(table.rejected[i])) for i in range(5)]
    _check(validator.metrics_processor.logged[-1], _expected(held, tok, 3.0, ref))


def test_held_out_dpo_metrics_with_the_adapters_off_reference(tmp_path):
    from transformers import AutoTokenizer

    held = _corpus(tmp_path / "data")
    run = resolve("objective=dpo", f"data.dataset_path={tmp_path / 'data'}", "eval=on")
    config_path = _saved(run, tmp_path / "run")
    trainer = _Trainer(config_path, run.training.seq_len, "adapters_off")
    trainer.validator = validator = _validator(run, config_path)
    bind(trainer)
    validator.validate(trainer.model_parts, step=7)
    assert trainer.adapter._lora_scaling == 2.0  # restored
    tok = AutoTokenizer.from_pretrained(run.data.hf_assets_path)
    ref = [
        (_completion_sum(tok, r, "chosen") / 1000, _completion_sum(tok, r, "rejected") / 1000) for r in held
    ]
    _check(validator.metrics_processor.logged[-1], _expected(held, tok, 3.0, ref))
