"""The passkey check's rank side (``rank/passkey.py``): a model that copies the key scores 1 at every
depth and one that never does scores 0 (the scoring), the files and metrics rank 0 writes, and a
run of the harness on the tiny model built in-process, plain and chat (its accuracy means nothing:
the harness is what is asserted), reproducible for a seed."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer
from torchtitan.config import OverrideConfig, apply_overrides

from qwen3_trainium.config import flavors
from qwen3_trainium.data import passkey as pk
from qwen3_trainium.data.assets import TOKENIZER_DIR
from qwen3_trainium.rank import passkey
from qwen3_trainium.rank.metrics import jsonl_key
from qwen3_trainium.rank.titan import SDPA_OVERRIDE

VOCAB = 508  # the shipped tokenizer's; id 0 (<|endoftext|>) is what model_logits pads with


class Copier(torch.nn.Module):
    """An induction head by hand: after the last real token, the token that followed the earlier
    place whose preceding tokens match the end of the prompt longest (so ``The pass key is`` is
    followed by the key, then the rest of the needle). ``wrong``: always predicts ``wrong``."""

    def __init__(self, wrong: int | None = None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.wrong = wrong

    def forward(self, tokens, positions):
        ids = tokens[0].tolist()
        last = max(i for i, t in enumerate(ids) if t != 0)
        out = torch.zeros(1, len(ids), VOCAB)
        out[0, last, self.wrong if self.wrong is not None else self._next(ids[: last + 1])] = 1.0
        return out + self.weight

    @staticmethod
    def _next(ids: list[int]) -> int:
        best, at = -1, 0
        for j in range(len(ids) - 1):
            k = 0
            while k <= j and ids[j - k] == ids[-1 - k]:
                k += 1
            if k > best:
                best, at = k, j + 1
        return ids[at]


def _config(tmp_path, **kw) -> passkey.PasskeyConfig:
    fields = {"length": 512, "depths": [0.0, 0.5, 1.0], "trials": 2, "seed": 3} | kw
    return passkey.PasskeyConfig(
        path=str(tmp_path / passkey.PASSKEY_JSON), tokenizer_dir=str(TOKENIZER_DIR), **fields
    )


def test_a_model_that_copies_the_key_scores_one_at_every_depth_and_rank_0_writes_the_table(tmp_path):
    record = passkey.passkey_on_ranks(Copier(), _config(tmp_path), step=9)
    keys = [pk.make_key(3, d, t) for d in (0.0, 0.5, 1.0) for t in range(2)]
    assert [t["key"] for t in record["trials"]] == keys
    assert [t["answer"] for t in record["trials"]] == keys, "the copier repeats each key"
    assert record["accuracy"] == {"0.0": 1.0, "0.5": 1.0, "1.0": 1.0} and record["mean_accuracy"] == 1.0
    assert all(t["prompt_tokens"] == 512 - pk.ANSWER_TOKENS for t in record["trials"])
    # greedy stops once the number is said: " 48213." is a handful of tokens, not ANSWER_TOKENS
    assert all(t["text"].startswith(f" {t['key']}.") for t in record["trials"])
    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    assert max(len(tok.encode(t["text"]).ids) for t in record["trials"]) < pk.ANSWER_TOKENS
    assert json.loads((tmp_path / "passkey.json").read_text())["trials"] == record["trials"]
    md = (tmp_path / "passkey.md").read_text()
    assert "# Passkey retrieval after step 9" in md
    assert f"| 0.5 | 1.00 | {keys[2]}, {keys[3]} | {keys[2]}, {keys[3]} |" in md
    assert record["metrics"] == {
        "passkey/depth_0": 1.0,
        "passkey/depth_0.5": 1.0,
        "passkey/depth_1": 1.0,
        "passkey/accuracy": 1.0,
    }
    assert [jsonl_key(k) for k in record["metrics"]] == [
        "passkey_depth_0",
        "passkey_depth_0.5",
        "passkey_depth_1",
        "passkey_accuracy",
    ]


def test_a_model_that_never_gives_the_key_scores_zero(tmp_path):
    seven = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json")).token_to_id("7")
    record = passkey.passkey_on_ranks(Copier(wrong=seven), _config(tmp_path, depths=[0.5]))
    assert record["accuracy"] == {"0.5": 0.0} and record["metrics"]["passkey/accuracy"] == 0.0
    assert {t["answer"] for t in record["trials"]} == {"7" * pk.ANSWER_TOKENS}  # no stop: all digits
    assert "| 0.5 | 0.00 |" in (tmp_path / "passkey.md").read_text()


def _tiny():
    spec = flavors.model_spec("tiny", "varlen")
    apply_overrides(OverrideConfig(imports=[SDPA_OVERRIDE]), spec)  # the swap a rank makes
    torch.manual_seed(0)
    model = spec.model.build()
    model.init_weights(buffer_device=None)
    return model


@pytest.mark.slow  # ~5 s: 12 forwards of 512 tokens
def test_the_harness_runs_on_the_tiny_model_plain_and_chat_and_is_reproducible(tmp_path):
    model = _tiny()
    plain = passkey.passkey_on_ranks(model, _config(tmp_path, trials=1))
    again = passkey.passkey_on_ranks(model, _config(tmp_path, trials=1))
    assert plain["trials"] == again["trials"], "same seed, same weights: same keys and answers"
    assert [t["depth"] for t in plain["trials"]] == [0.0, 0.5, 1.0]
    assert all(0 < len(t["text"]) and t["prompt_tokens"] == 496 for t in plain["trials"])
    assert set(plain["accuracy"]) == {"0.0", "0.5", "1.0"}
    chat = passkey.passkey_on_ranks(
        model, _config(tmp_path, trials=1, chat_template=str(TOKENIZER_DIR / "chat_template.jinja"))
    )
    assert [t["key"] for t in chat["trials"]] == [t["key"] for t in plain["trials"]]
    assert all(t["prompt_tokens"] == 496 for t in chat["trials"])
    assert "a user turn of the chat template" in (tmp_path / "passkey.md").read_text()


def test_the_figures_reach_metrics_jsonl_and_the_jobs_final_metrics(tmp_path):
    from qwen3_trainium.parent import report
    from qwen3_trainium.rank.metrics import JsonlLogger

    path = tmp_path / "metrics.jsonl"
    logger = JsonlLogger(str(path), report_mfu=False)
    logger.log({"loss_metrics/global_avg_loss": 5.0}, 10)
    logger.log(passkey.metrics({0.0: 1.0, 0.5: 0.5}), 10)  # after the last step, as the trainer logs it
    logger.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert {k: v for k, v in rows[1].items() if k != "time"} == {
        "step": 10,
        "passkey_depth_0": 1.0,
        "passkey_depth_0.5": 0.5,
        "passkey_accuracy": 0.75,
    }
    assert report.final_metrics(str(tmp_path))["final_passkey_accuracy"] == 0.75
    assert report.final_metrics(str(tmp_path))["final_loss"] == 5.0
