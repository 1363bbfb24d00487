"""The passkey prompt (``data/passkey.py``): its length is the one asked, the key sits at the asked
depth, its ids are what the tokenizer (plain) and Transformers' ``apply_chat_template`` (chat)
make of its text, the keys are reproducible, and answers are scored by their first number."""

from __future__ import annotations

import os

import pytest
from tokenizers import Tokenizer

from qwen3_trainium.data import passkey as pk
from qwen3_trainium.data.assets import TOKENIZER_DIR
from qwen3_trainium.data.chat.template import ChatTokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))


def _longest_word(tok) -> int:
    """Tokens of the longest word of the filler (the depth's granularity with this tokenizer)."""
    return max(len(tok.encode(" " + w).ids) for w in pk.FILLER.split())


@pytest.mark.parametrize("length", [256, 1000, 4096])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_plain_prompt_has_the_asked_length_and_the_key_at_the_asked_depth(tok, length, depth):
    prompt = pk.Builder(tok).build(length, depth, "48213")
    assert len(prompt.ids) == length - pk.ANSWER_TOKENS
    assert tok.encode(prompt.text).ids == prompt.ids, "the ids are the tokenizer's own for the text"
    # by hand: the needle's text starts right at key_at, after the head and `before` filler tokens
    head = len(tok.encode(pk.HEAD).ids)
    assert prompt.key_at == head + prompt.before
    assert tok.decode(prompt.ids[prompt.key_at :]).startswith(" The pass key is 48213. Remember it.")
    assert prompt.text.endswith(" What is the pass key? The pass key is")
    assert prompt.text.count("48213") == 2  # the needle says it twice, nothing else does
    # depth: the filler tokens before the key are depth x all filler tokens, to within a word
    assert abs(prompt.before - depth * prompt.filler) <= _longest_word(tok) / 2 + 0.5
    fill = len(prompt.ids) - head - len(tok.encode(pk.NEEDLE.format(key="48213")).ids)
    assert prompt.filler == fill - len(tok.encode(pk.QUESTION_PLAIN).ids)


def test_chat_prompt_is_a_user_turn_as_transformers_renders_it(tok):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    chat = ChatTokenizer.load(str(TOKENIZER_DIR))
    prompt = pk.Builder(tok, chat).build(512, 0.5, "90817")
    body = prompt.text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    assert body.startswith(pk.HEAD) and body.endswith(" What is the pass key?")
    want = hf.apply_chat_template(
        [{"role": "user", "content": body}], add_generation_prompt=True, enable_thinking=False, tokenize=False
    )
    assert want.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert hf(want, add_special_tokens=False)["input_ids"] == prompt.ids
    assert len(prompt.ids) == 512 - pk.ANSWER_TOKENS
    assert tok.decode(prompt.ids[prompt.key_at :]).startswith(" The pass key is 90817.")


def test_keys_are_reproducible_five_digits_and_differ_by_trial_and_depth():
    keys = {(d, t): pk.make_key(7, d, t) for d in (0.0, 0.5, 1.0) for t in range(4)}
    assert keys == {(d, t): pk.make_key(7, d, t) for d in (0.0, 0.5, 1.0) for t in range(4)}
    assert all(len(k) == 5 and k.isdigit() and k[0] != "0" for k in keys.values())
    assert len(set(keys.values())) == len(keys)
    assert pk.make_key(8, 0.5, 0) != pk.make_key(7, 0.5, 0)


def test_a_length_too_short_for_the_prompt_is_refused(tok):
    need = pk.Builder(tok).overhead() + pk.ANSWER_TOKENS
    assert len(pk.Builder(tok).build(need, 0.5, "99999").ids) == need - pk.ANSWER_TOKENS
    with pytest.raises(pk.PasskeyError, match=f"cannot hold the passkey prompt \\({need} tokens at least\\)"):
        pk.Builder(tok).build(need - 1, 0.5, "99999")


def test_an_answer_is_its_first_number_after_the_reasoning_and_scores_by_depth():
    assert pk.answer(" 48213. Remember") == "48213"
    assert pk.answer("<think>maybe 11111</think>\n\nThe pass key is 48213.") == "48213"
    assert pk.answer(" I do not know.") is None
    trials = [
        {"depth": 0.5, "correct": True},
        {"depth": 0.0, "correct": False},
        {"depth": 0.5, "correct": False},
        {"depth": 0.0, "correct": False},
    ]
    assert pk.scores(trials) == {0.0: 0.0, 0.5: 0.5}
