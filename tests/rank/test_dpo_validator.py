"""The held-out preference metrics (``rank/dpo_validator.py``) on a toy model whose per-side
log-prob sums an oracle computes from the records alone (Transformers' chat template, TRL's
completion rule, float64 log-softmax): the validator's loss and TRL's metrics against the hand
formulas, with a precomputed table and with the adapters-off reference. Fast: no torchrun."""

from __future__ import annotations

import contextlib
import json
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import resolve
from test_dpo_reference import _pair, _saved

from qwen3_trainium.rank import dpo_reference
from qwen3_trainium.rank.dpo_validator import PreferenceValidator, bind

BETA = 0.1


def _corpus(folder, n_train: int = 4, n_val: int = 5) -> list[dict]:
    folder.mkdir()
    held = [_pair(100 + i) for i in range(n_val)]
    (folder / "train.jsonl").write_text("".join(json.dumps(_pair(i)) + "\n" for i in range(n_train)))
    (folder / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    return held


class _Toy(torch.nn.Module):
    """A model whose hidden state at a position is its token's embedding times (1 + its
    adapter's scale), as a LoRA model's output moves with ``_lora_scaling``: each token's
    log-prob depends on the previous token alone, so the oracle needs no packing, no masks."""

    def __init__(self, vocab: int = 512, dim: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, dim)
        self._lora_scaling = 2.0

    def forward(self, inputs, positions=None, **kwargs):
        return self.embed(inputs) * (1 + self._lora_scaling)


def _logps(model, head, ids: list[int], start: int, scale: float) -> float:
    """Transformers' ids from ``start`` on: sum of log p(id | previous id), in float64."""
    prev, nxt = torch.tensor(ids[start - 1 : -1]), torch.tensor(ids[start:])
    logits = head.double()(model.embed(prev).double() * scale)
    return float(torch.log_softmax(logits, -1).gather(1, nxt[:, None]).sum())


class _Trainer:
    step = 0


class _Metrics:
    ntokens_since_last_log = 0

    def __init__(self):
        self.logged = []

    def log_validation(self, loss, step, extra_metrics=None):
        self.logged.append((loss, step, dict(extra_metrics)))


def _validator(run, config_path: str, model) -> PreferenceValidator:
    from torchtitan.config import ParallelismConfig

    from qwen3_trainium.data.preference.loader import PreferenceDataLoader

    config = PreferenceValidator.Config(
        enable=True,
        freq=1,
        steps=-1,
        last_step=1,
        dataloader=PreferenceDataLoader.Config(config_path=config_path, split="validation", infinite=False),
    )
    head = torch.nn.Linear(model.embed.embedding_dim, model.embed.num_embeddings, bias=False)
    return config.build(
        parallelism=ParallelismConfig(),
        dp_world_size=1,
        dp_rank=0,
        tokenizer=None,
        parallel_dims=SimpleNamespace(cp_enabled=False),
        loss_fn=SimpleNamespace(lm_head=head, num_chunks=4),  # the trainer's ChunkedLossWrapper's
        validation_context=contextlib.nullcontext,
        metrics_processor=_Metrics(),
        seq_len=run.training.seq_len,
        local_batch_size=2,
    )


def _expected(held: list[dict], side_logps, ref: list[tuple[float, float]]) -> dict:
    """TRL 1.16.0's sigmoid loss and eval metrics by hand (dpo_trainer.py:1387, :1582-1601)."""
    rows = []
    for record, (rc, rr) in zip(held, ref, strict=True):
        pc, pr = side_logps(record, "chosen"), side_logps(record, "rejected")
        chosen, rejected = BETA * (pc - rc), BETA * (pr - rr)
        loss = math.log1p(math.exp(-(chosen - rejected)))  # -log sigmoid
        rows.append((loss, chosen, rejected, float(chosen > rejected), chosen - rejected, pc, pr))
    means = [sum(col) / len(rows) for col in zip(*rows, strict=True)]
    names = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins")
    return dict(zip(names + ("logps/chosen", "logps/rejected"), means, strict=True))


def _oracle(tok, model, head, scale: float):
    """A side's completion log-prob: TRL's completion (``_completion_sum``'s rule) scored by
    the toy model in float64."""

    def side(record: dict, which: str) -> float:
        prompt = tok.apply_chat_template(record["prompt"], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        full = tok.apply_chat_template(record["prompt"] + record[which], tokenize=True)["input_ids"]
        k = next((i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b), len(prompt))
        return _logps(model, head, full, k, scale)

    return side


def _check(logged, want: dict) -> None:
    """1e-5: float32 side sums of about -100 (the validator's, as training's) against the float64
    oracle; the margins, beta times differences of such sums, were 1.9e-6 off."""
    loss, step, extra = logged
    assert step == 7 and loss == pytest.approx(want["loss"], rel=1e-5, abs=1e-5)
    for name, value in want.items():
        if name != "loss":
            assert extra[f"validation_metrics/{name}"] == pytest.approx(value, rel=1e-5, abs=1e-5), name


def _setup(tmp_path, reference: str):
    from transformers import AutoTokenizer

    held = _corpus(tmp_path / "data")
    overrides = [f"data.dataset_path={tmp_path / 'data'}", "eval=on", f"objective.dpo.reference={reference}"]
    run = resolve("objective=dpo", *overrides, *(["peft=lora"] if reference == "adapters_off" else []))
    config_path = _saved(run, tmp_path / "run")
    model = _Toy()
    validator = _validator(run, config_path, model)
    return held, run, model, validator, AutoTokenizer.from_pretrained(run.data.hf_assets_path)


def test_held_out_dpo_loss_and_metrics_with_the_precomputed_reference(tmp_path):
    held, run, model, validator, tok = _setup(tmp_path, "precompute")
    table = dpo_reference.ReferenceTable(
        -torch.arange(5.0) - 60,
        -torch.arange(5.0) * 3 - 50,
        torch.ones(5, dtype=torch.bool),
        run.training.seq_len,
    )
    table.save(dpo_reference.table_path(run, "validation"))  # as the run's first start wrote it
    trainer = _Trainer()
    trainer.config = SimpleNamespace(dpo=SimpleNamespace(config_path=validator.dl_config.config_path))
    trainer.config.training = SimpleNamespace(seq_len=run.training.seq_len)
    trainer.config.validator, trainer.validator = SimpleNamespace(enable=True), validator
    bind(trainer)
    validator.validate([model], step=7)
    assert model.training  # the mode it had
    ref = [(float(table.chosen[i]), float(table.rejected[i])) for i in range(5)]
    want = _expected(held, _oracle(tok, model, validator.loss_fn.lm_head, 3.0), ref)
    _check(validator.metrics_processor.logged[-1], want)


def test_held_out_dpo_metrics_with_the_adapters_off_reference(tmp_path):
    held, run, model, validator, tok = _setup(tmp_path, "adapters_off")
    validator.validate([model], step=7)
    assert model._lora_scaling == 2.0  # restored
    head = validator.loss_fn.lm_head
    base = _oracle(tok, model, head, 1.0)
    ref = [(base(r, "chosen"), base(r, "rejected")) for r in held]
    _check(validator.metrics_processor.logged[-1], _expected(held, _oracle(tok, model, head, 3.0), ref))
