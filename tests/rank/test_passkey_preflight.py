"""Pre-flight of eval.long_context (``parent/preflight/passkey.py``): each bad setting is refused
naming the key, the value and the fix; the shipped ``eval=long_context`` passes."""

from __future__ import annotations

import pytest
from conftest import resolve

from qwen3_trainium.data import passkey as pk
from qwen3_trainium.parent.preflight.passkey import check_long_context

ON = ("eval=on", "eval.long_context=true")


def _one(*overrides: str):
    problems = check_long_context(resolve(*overrides))
    assert len(problems) == 1, problems
    return problems[0]


def test_the_shipped_option_passes_and_off_checks_nothing():
    assert check_long_context(resolve("eval=long_context")) == []
    assert check_long_context(resolve("eval=long_context", "data=chat")) == []
    assert check_long_context(resolve("eval.long_context_depths=[7]")) == []  # long_context off


def test_without_eval_on_it_runs_on_its_own():
    # the issue's own spelling: eval.long_context=on, no held-out loss needed
    assert check_long_context(resolve("eval.long_context=on")) == []
    from qwen3_trainium.rank.titan_eval import evaluation

    _, fields = evaluation(resolve("eval.long_context=on"), "/tmp/unused")
    assert set(fields) == {"passkey"} and fields["passkey"].length == 256


@pytest.mark.parametrize(
    ("depths", "named"),
    [("[0.5,1.5]", "holds 1.5, outside [0, 1]"), ("[-0.1]", "holds -0.1"), ("[]", "is empty")],
)
def test_depths_outside_zero_to_one_are_refused(depths, named):
    p = _one(*ON, f"eval.long_context_depths={depths}")
    assert p.key == "eval.long_context_depths" and named in p.message and "eval.long_context_depths=" in p.fix


def test_no_trials_is_refused():
    p = _one(*ON, "eval.long_context_trials=0")
    assert (p.key, p.value, p.fix) == ("eval.long_context_trials", 0, "eval.long_context_trials=2")


def test_a_length_past_the_rotary_table_is_refused():
    # training.seq_len 256 (the default on CPU): 4096 tokens are past the table torchtitan sizes to it
    p = _one(*ON, "eval.long_context_length=4096")
    assert (p.key, p.value) == ("eval.long_context_length", 4096)
    assert "past training.seq_len (256)" in p.message and p.fix == "eval.long_context_length=256 or less"
    p = _one(*ON, "training.seq_len=128")  # 0: training.seq_len, whose padded forward is 256
    assert p.fix == "training.seq_len=256 or more"


@pytest.mark.parametrize("data", ["data=embedded", "data=chat"])
def test_a_length_too_short_for_the_key_and_question_is_refused(data):
    from tokenizers import Tokenizer

    from qwen3_trainium.data.assets import TOKENIZER_DIR

    p = _one(*ON, data, "eval.long_context_length=100")
    assert (p.key, p.value) == (
        "eval.long_context_length",
        100,
    ) and "cannot hold the passkey prompt" in p.message
    need = int(p.fix.split("=")[1].split()[0])
    # the fix's length holds every key of the run's check; one less does not hold the longest
    run = resolve(*ON, data, f"eval.long_context_length={need}")
    assert check_long_context(run) == []
    chat = None
    if data == "data=chat":
        from qwen3_trainium.data.chat.template import ChatTokenizer

        chat = ChatTokenizer.load(str(TOKENIZER_DIR))
    builder = pk.Builder(Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json")), chat)
    keys = pk.keys(42, list(run.eval.long_context_depths), run.eval.long_context_trials)
    assert max(len(builder.build(need, 0.5, k).ids) for k in keys) <= need - pk.ANSWER_TOKENS
    with pytest.raises(pk.PasskeyError):
        for k in keys:
            builder.build(need - 1, 0.5, k)
