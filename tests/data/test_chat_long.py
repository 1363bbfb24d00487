"""Long thinking traces (``data/chat/overflow.py``, the counts of ``stream.Summary``): with
``data.overflow=truncate`` a sample past seq_len loses reasoning from the middle of its think block
and keeps its whole answer, exactly as Transformers' ``apply_chat_template`` renders the kept text;
where that cannot be done the end is cut and the reason counted; the dry run's counts add up.

The traces are made here: seeded words, several thousand tokens of the shipped tokenizer."""

from __future__ import annotations

import json
import random

import pytest

from qwen3_trainium.data.assets import TOKENIZER_DIR
from qwen3_trainium.data.chat import records
from qwen3_trainium.data.chat.masks import Counts, Masker, encode
from qwen3_trainium.data.chat.template import ChatTokenizer

WORDS = "so the next step is to check whether each term fits then add them up and compare again".split()
ANSWER = "The answer is 42, since 6 times 7 is 42."


def trace(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words)) + "."


def long_record(n_words: int, seed: int = 0, answer: str = ANSWER) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"Question {seed}: what is 6 times 7?"},
            {"role": "assistant", "reasoning_content": trace(n_words, seed), "content": answer},
        ]
    }


@pytest.fixture(scope="module")
def ours():
    return ChatTokenizer.load(str(TOKENIZER_DIR))


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def hf_ids(hf, messages: list[dict]) -> list[int]:
    return hf(hf.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]


def assistant_block(hf, ids: list[int]) -> set[int]:
    """By hand: the last ChatML block's tokens after ``<|im_start|>assistant\\n``, its <|im_end|> too."""
    start, end = hf.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    at = len(ids) - 1 - ids[::-1].index(start)
    header = at + 1
    while "\n" not in hf.decode([ids[header]]):
        header += 1
    return set(range(header + 1, ids.index(end, header) + 1))


def kept_reasoning(text: str) -> str:
    return text.split("<think>\n")[-1].split("\n</think>")[0]


def test_truncate_cuts_the_middle_of_the_reasoning_and_keeps_the_whole_answer(ours, hf):
    record = long_record(1500)
    whole = hf_ids(hf, record["messages"])
    assert len(whole) > 3000, "several thousand tokens"
    counts = Counts()
    (doc,) = encode(Masker(ours), records.conversation(record, "long:1"), 1024, "truncate", counts)
    assert 1024 - 4 <= len(doc.ids) - 1 <= 1024 and doc.truncated
    text = ours.tokenizer.decode(doc.ids, skip_special_tokens=False)
    assert text.endswith(f"</think>\n\n{ANSWER}<|im_end|>\n")
    kept, original = kept_reasoning(text), record["messages"][1]["reasoning_content"]
    head = next(i for i in range(len(kept)) if not original.startswith(kept[: i + 1]))
    assert original.endswith(kept[head:]), "the kept reasoning is the original's opening and its end"
    assert 400 < head and 400 < len(kept) - head, "both halves kept"
    # the oracle: Transformers renders the conversation with the kept reasoning to the same ids,
    # and the assistant's block after its header is exactly what is supervised
    messages = [record["messages"][0], {**record["messages"][1], "reasoning_content": kept}]
    assert hf_ids(hf, messages) == doc.ids
    assert {i for i, s in enumerate(doc.supervised) if s} == assistant_block(hf, doc.ids)
    assert (counts.truncated, counts.cut_in_reasoning, counts.cut_at_end) == (1, 1, {})
    assert counts.tokens_cut == len(whole) - len(doc.ids)


def test_only_the_reasoning_the_template_renders_is_cut(ours, hf):
    """Two exchanges: Qwen3 drops the first turn's reasoning once a user follows; the last is cut."""
    first = long_record(1200, seed=1)["messages"]
    last = long_record(1200, seed=2)["messages"]
    record = {"messages": first + last}
    (doc,) = encode(
        Masker(ours, loss_on="last_assistant"),
        records.conversation(record, "x:1"),
        1024,
        "truncate",
        Counts(),
    )
    text = ours.tokenizer.decode(doc.ids, skip_special_tokens=False)
    assert first[1]["reasoning_content"] not in text and text.count("<think>") == 1
    kept = kept_reasoning(text)
    messages = first + [last[0], {**last[1], "reasoning_content": kept}]
    assert hf_ids(hf, messages) == doc.ids and len(doc.ids) - 1 <= 1024
    assert text.endswith(f"{ANSWER}<|im_end|>\n")


def test_where_the_answer_alone_is_past_seq_len_the_end_is_cut_and_the_reason_counted(ours):
    counts = Counts()
    record = long_record(50, answer=trace(800, 9))  # a short trace, an answer of ~1500 tokens
    (doc,) = encode(Masker(ours), records.conversation(record, "x:1"), 512, "truncate", counts)
    assert len(doc.ids) == 513 and counts.cut_in_reasoning == 0
    assert counts.cut_at_end == {
        "still past seq_len with the reasoning cut out (the answer and the rest are too long)": 1
    }
    no_think = {"messages": [record["messages"][0], {"role": "assistant", "content": trace(800, 9)}]}
    encode(Masker(ours), records.conversation(no_think, "x:2"), 512, "truncate", counts)
    assert counts.cut_at_end["no reasoning to cut (the answer and the rest are past seq_len)"] == 1


def _write_corpus(tmp_path, hf) -> tuple[str, list[int]]:
    """12 long traces (3000 to 6000 tokens) and 12 short ones; each sample's input positions."""
    rows = [long_record(1000 + 200 * i, seed=i) for i in range(12)]
    rows += [long_record(20 + i, seed=100 + i) for i in range(12)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path), [len(hf_ids(hf, r["messages"])) - 1 for r in rows]


@pytest.mark.parametrize("overflow", ["drop", "truncate"])
def test_the_dry_run_counts_of_long_traces_add_up(tmp_path, hf, overflow):
    from conftest import resolve

    from qwen3_trainium.data.chat import source

    path, lengths = _write_corpus(tmp_path, hf)
    run = resolve(
        "data=chat", f"data.dataset_path={path}", "training.seq_len=2048", f"data.overflow={overflow}"
    )
    summary = source.summarise(run)
    c = summary.counts
    long = [n for n in lengths if n > 2048]
    assert len(long) == 12 and c.records == 24
    if overflow == "drop":
        assert (c.dropped, c.truncated, c.samples) == (12, 0, 12)
        assert c.tokens_dropped == sum(long) and c.tokens == sum(lengths) - sum(long)
    else:
        assert (c.dropped, c.truncated, c.cut_in_reasoning, c.samples) == (0, 12, 12, 24)
        assert c.tokens + c.tokens_cut == sum(lengths) and 12 * 2044 <= c.tokens - (sum(lengths) - sum(long))
    assert summary.real == c.tokens, "every kept token is in a row"
    assert summary.efficiency == c.tokens / (summary.rows * 2048)
    lines = summary.lines()
    lost = sum(lengths) - c.tokens
    assert f"{lost} of {sum(lengths)} tokens" in "\n".join(lines)
    if overflow == "truncate":
        assert "truncated: 12 inside the reasoning, the final answer kept" in lines


def test_the_preview_of_a_long_row_shows_its_ends_and_counts_the_middle(tmp_path, hf):
    from conftest import resolve

    from qwen3_trainium.data.chat import source

    path = tmp_path / "train.jsonl"  # traces of 5000 tokens and more: each fills a row alone
    path.write_text("".join(json.dumps(long_record(2500 + 100 * i, seed=i)) + "\n" for i in range(3)))
    run = resolve("data=chat", f"data.dataset_path={path}", "training.seq_len=4096", "data.overflow=truncate")
    (row,) = source.preview_rows(run, 1)
    md_path, _ = source.write_preview(run, str(tmp_path / "run"), 1)
    md = open(md_path).read()
    whole = hf.decode(row.input_ids[: row.real])
    assert row.real > 3000 and len(md) < len(whole) / 3, "a long row's preview is not the whole row"
    hidden = row.real - 800
    supervised = sum(label >= 0 for label in row.labels[399 : row.real - 401])
    starts = row.positions[400 : row.real - 400].count(0)
    assert f"⟪… {hidden} tokens not shown: {supervised} supervised" in md
    assert (f", {starts} sample" in md) == (starts > 0)
    body = md.split("```text\n")[1].split("\n```")[0]
    assert body.startswith(whole[:60]), "the row's first tokens are shown as they are"
    assert body.count("⟦") == body.count("⟧") and body.endswith(f"{ANSWER}<|im_end|>⟧")
