"""The chat masks, proven independently of the code that builds them.

The expectation is made another way entirely: Transformers renders the record's messages as
read, inline ``<think>`` and all (the template splits it itself: our ``normalise`` is not asked),
with the pinned copy of Qwen3's published template (``fixtures/qwen3_chat_template.jinja``) and
tokenizes it; the token ids are then cut into ChatML blocks (``<|im_start|>role\\n ... <|im_end|>``),
and a trained assistant block is expected supervised from the token after its header's newline
through its ``<|im_end|>``; nothing else is. Our masks (render by difference, ``masks.py``) must
select exactly that set, for each of the four formats, read from JSONL, JSON and Parquet files.
Where a turn sits in the conversation (first, after a system message, after a tools block), the
render and the supervised text are also written out by hand from the template's text.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwen3_trainium.data.assets import TOKENIZER_DIR
from qwen3_trainium.data.chat import records
from qwen3_trainium.data.chat.masks import Counts, Masker, encode
from qwen3_trainium.data.chat.template import ChatTokenizer

PINNED = Path(__file__).parent / "fixtures" / "qwen3_chat_template.jinja"
SYSTEM = "You are a helpful assistant."
R1, C1 = "France is a country. Its capital is Paris.", "The capital of France is Paris."
R2, C2 = "2 plus 3: count 3 up from 2. That is 5.", "2 plus 3 is 5."
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
]

MESSAGES = {
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": C1, "reasoning_content": R1},
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": C2, "reasoning_content": R2},
    ]
}
TOOL_CALLS = {
    "tools": TOOLS,
    "messages": [
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": C2, "reasoning_content": R2},
    ],
}  # fmt: skip
SHAREGPT = {
    "system": SYSTEM,
    "conversations": [
        {"from": "human", "value": "What is the capital of France?"},
        {"from": "gpt", "value": f"<think>\n{R1}\n</think>\n\n{C1}"},  # ShareGPT keeps reasoning inline
        {"from": "human", "value": "What is 2 plus 3?"},
        {"from": "gpt", "value": f"<think>\n{R2}\n</think>\n\n{C2}"},
    ],
}
GREETING = "Hello! How can I help?"
ASSISTANT_FIRST = [  # a conversation the assistant opens (a greeting), as chat exports hold them
    {"role": "assistant", "content": GREETING},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Sure."},
]
PROMPT_COMPLETION = {
    "prompt": MESSAGES["messages"][:4],
    "completion": [{"role": "assistant", "content": C2, "reasoning_content": R2}],
}
ALPACA = {"system": SYSTEM, "instruction": "Add the numbers.", "input": "2 and 3", "output": C2}

# (record, file suffix, which assistant blocks are trained: their order among assistant blocks)
CASES = {
    "messages": (MESSAGES, ".jsonl", [0, 1]),
    "messages_tool_calls": (TOOL_CALLS, ".json", [0, 1]),
    "sharegpt": (SHAREGPT, ".parquet", [0, 1]),
    "prompt_completion": (PROMPT_COMPLETION, ".jsonl", [1]),  # the prompt's assistant turn is context
    "alpaca": (ALPACA, ".json", [0]),
    "assistant_first_tools": ({"tools": TOOLS, "messages": ASSISTANT_FIRST}, ".jsonl", [0, 1]),
}


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    tok.chat_template = PINNED.read_text()
    return tok


@pytest.fixture(scope="module")
def ours():
    return ChatTokenizer.load(str(TOKENIZER_DIR), str(PINNED))


def _write(record: dict, path: Path) -> Path:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([record]), path)
    elif path.suffix == ".json":
        path.write_text(json.dumps([record]))
    else:
        path.write_text(json.dumps(record) + "\n")
    return path


def _hf_messages(conv) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "train"} for m in conv.messages]


def expected_supervised(hf_tokenizer, ids: list[int], trained_blocks: list[int]) -> set[int]:
    """ChatML blocks of the token ids; the trained assistant blocks' tokens after the header."""
    start, end = hf_tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    out, assistant_index, i = set(), -1, 0
    while i < len(ids):
        if ids[i] != start:
            i += 1
            continue
        header_end = i + 1
        while "\n" not in hf_tokenizer.decode([ids[header_end]]):
            header_end += 1
        role = hf_tokenizer.decode(ids[i + 1 : header_end + 1]).strip()
        close = ids.index(end, header_end)
        if role == "assistant":
            assistant_index += 1
            if assistant_index in trained_blocks:
                out.update(range(header_end + 1, close + 1))
        i = close + 1
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_masks_match_the_chatml_blocks_of_the_stock_qwen3_template(case, tmp_path, hf_tokenizer, ours):
    record, suffix, trained = CASES[case]
    (conv,) = records.load([str(_write(record, tmp_path / f"data{suffix}"))])
    (doc,) = Masker(ours).docs(conv)

    text = hf_tokenizer.apply_chat_template(_hf_messages(conv), tools=conv.tools, tokenize=False)
    ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert doc.ids == ids, "our render and tokenization equal Transformers' apply_chat_template"

    want = expected_supervised(hf_tokenizer, ids, trained)
    got = {i for i, s in enumerate(doc.supervised) if s}
    assert got == want, (
        f"extra: {hf_tokenizer.decode([ids[i] for i in sorted(got - want)])!r} "
        f"missing: {hf_tokenizer.decode([ids[i] for i in sorted(want - got)])!r}"
    )
    supervised_text = hf_tokenizer.decode([ids[i] for i in sorted(got)])
    # the last turn's reasoning is rendered and trained on; the end-of-turn token is supervised
    assert supervised_text.endswith("<|im_end|>")
    if case not in ("alpaca", "assistant_first_tools"):  # these records carry no reasoning
        assert R2 in text and R2 in supervised_text
    unsupervised = hf_tokenizer.decode([ids[i] for i in range(len(ids)) if i not in got])
    assert SYSTEM not in supervised_text and "What is" not in supervised_text
    if case in ("messages", "sharegpt"):
        assert R1 not in text, "Qwen3 drops the reasoning of turns before the last user message"
        assert C1 in supervised_text and C1 not in unsupervised
    inputs, labels = doc.inputs_labels()
    assert inputs == ids[:-1] and len(labels) == len(ids) - 1
    assert {i + 1 for i, label in enumerate(labels) if label != -100} == want


# The stock template's tools block, copied from its text (fixtures/qwen3_chat_template.jinja)
TOOLS_BLOCK = (
    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOLS[0])
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within"
    ' <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments":'
    " <args-json-object>}\n</tool_call><|im_end|>\n"
)
OPENING = f"<|im_start|>assistant\n{GREETING}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
LAST = "<|im_start|>assistant\n<think>\n\n</think>\n\nSure.<|im_end|>\n"  # after the last user message
# case: (messages, tools, chat_template_kwargs, the render by hand, the supervised text by hand, in order)
BY_HAND = {
    "assistant_first": (
        ASSISTANT_FIRST,
        None,
        {},
        OPENING + LAST,
        [f"{GREETING}<|im_end|>", "<think>\n\n</think>\n\nSure.<|im_end|>"],
    ),
    # inference's prompt holds the empty think block here, so training does not supervise it
    "assistant_first_no_thinking": (
        ASSISTANT_FIRST,
        None,
        {"enable_thinking": False},
        OPENING + LAST,
        [f"{GREETING}<|im_end|>", "Sure.<|im_end|>"],
    ),
    "assistant_first_after_tools": (
        ASSISTANT_FIRST,
        TOOLS,
        {},
        TOOLS_BLOCK + OPENING + LAST,
        [f"{GREETING}<|im_end|>", "<think>\n\n</think>\n\nSure.<|im_end|>"],
    ),
    "assistant_after_system": (
        [{"role": "system", "content": SYSTEM}, *ASSISTANT_FIRST],
        None,
        {},
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n" + OPENING + LAST,
        [f"{GREETING}<|im_end|>", "<think>\n\n</think>\n\nSure.<|im_end|>"],
    ),
}


def _by_hand(hf_tokenizer, render: str, pieces: list[str]) -> tuple[list[int], set[int]]:
    """The render's token ids, and those inside the pieces' character spans (found in order with
    str.index); every piece must be whole tokens, so "inside" is unambiguous."""
    encoded = hf_tokenizer(render, add_special_tokens=False, return_offsets_mapping=True)
    spans, at = [], 0
    for piece in pieces:
        at = render.index(piece, at)
        spans.append((at, at + len(piece)))
        at += len(piece)
    offsets = encoded["offset_mapping"]
    bounds = {s for s, _ in offsets} | {e for _, e in offsets}
    assert all(a in bounds and b in bounds for a, b in spans), "each piece is whole tokens"
    return encoded["input_ids"], {
        i for i, (s, e) in enumerate(offsets) if any(a <= s and e <= b for a, b in spans)
    }


@pytest.mark.parametrize("case", sorted(BY_HAND))
def test_no_assistant_header_is_supervised_wherever_the_turn_sits(case, hf_tokenizer, ours):
    """The render and the supervised pieces are written by hand from the template's text."""
    messages, tools, kwargs, render, pieces = BY_HAND[case]
    assert hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs) == render
    record = {"messages": messages, "tools": tools, "chat_template_kwargs": kwargs}
    (doc,) = Masker(ours).docs(records.conversation(record, "x:1"))
    ids, want = _by_hand(hf_tokenizer, render, pieces)
    assert doc.ids == ids
    got = {i for i, supervised in enumerate(doc.supervised) if supervised}
    assert got == want, f"supervised: {hf_tokenizer.decode([doc.ids[i] for i in sorted(got)])!r}"


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
DEFAULT_SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
# Qwen2.5's way: a default system message unless the first message is one (it reads messages[0],
# so it cannot render an empty conversation, as Qwen3's cannot)
WITH_DEFAULT_SYSTEM = (
    "{% if messages[0].role != 'system' %}{{ '"
    + DEFAULT_SYSTEM.replace("\n", "\\n")
    + "' }}{% endif %}"
    + CHATML
)


@pytest.mark.parametrize(
    "template, preamble",
    [(CHATML, ""), (WITH_DEFAULT_SYSTEM, DEFAULT_SYSTEM)],
    ids=["plain", "default_system"],
)
def test_a_first_turn_is_placed_whether_or_not_the_template_renders_no_messages(
    template, preamble, tmp_path, hf_tokenizer
):
    path = tmp_path / "chat_template.jinja"
    path.write_text(template)
    render = preamble + (
        f"<|im_start|>assistant\n{GREETING}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nSure.<|im_end|>\n"
    )
    assert hf_tokenizer.apply_chat_template(ASSISTANT_FIRST, chat_template=template, tokenize=False) == render
    ours = ChatTokenizer.load(str(TOKENIZER_DIR), str(path))
    (doc,) = Masker(ours).docs(records.conversation({"messages": ASSISTANT_FIRST}, "x:1"))
    ids, want = _by_hand(hf_tokenizer, render, [f"{GREETING}<|im_end|>", "Sure.<|im_end|>"])
    assert doc.ids == ids
    got = {i for i, supervised in enumerate(doc.supervised) if supervised}
    assert got == want, f"supervised: {hf_tokenizer.decode([doc.ids[i] for i in sorted(got)])!r}"


def test_enable_thinking_false_leaves_the_empty_think_block_to_the_prompt(hf_tokenizer, ours):
    """enable_thinking=false: inference's prompt ends with an empty <think></think>, so training
    does not supervise it; a history turn starting with '<' is still placed exactly."""
    conv = records.conversation(
        {
            "messages": [
                {"role": "user", "content": "Tag?"},
                {"role": "assistant", "content": "<b>bold</b>"},
                {"role": "user", "content": "Again?"},
                {"role": "assistant", "content": "<i>it</i>"},
            ],
            "chat_template_kwargs": {"enable_thinking": False},
        },
        "x:1",
    )
    (doc,) = Masker(ours).docs(conv)
    text = hf_tokenizer.apply_chat_template(_hf_messages(conv), tokenize=False, enable_thinking=False)
    ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert doc.ids == ids
    got = {i for i, s in enumerate(doc.supervised) if s}
    supervised = hf_tokenizer.decode([ids[i] for i in sorted(got)])
    assert supervised == "<b>bold</b><|im_end|><i>it</i><|im_end|>"
    # the Transformers render of the generation prompt is what our mask leaves out
    prompt = hf_tokenizer.apply_chat_template(
        _hf_messages(conv)[:3], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert prompt.endswith("<think>\n\n</think>\n\n") and text.startswith(
        prompt[: -len("<think>\n\n</think>\n\n")]
    )


def _conv():
    return records.conversation(MESSAGES, "x:1")


def test_loss_on_and_train_flags(ours):
    def supervised_text(masker, conv):
        (doc,) = masker.docs(conv)
        return ours.tokenizer.decode(
            [t for t, s in zip(doc.ids, doc.supervised, strict=False) if s], skip_special_tokens=False
        )

    assert supervised_text(Masker(ours, loss_on="last_assistant"), _conv()).startswith("<think>")
    assert C1 not in supervised_text(Masker(ours, loss_on="last_assistant"), _conv())
    conv = _conv()
    conv.messages[4]["train"] = False
    assert supervised_text(Masker(ours), conv) == C1 + "<|im_end|>"
    everything = supervised_text(Masker(ours, loss_on="all"), _conv())
    assert SYSTEM in everything and "What is" in everything
    less = supervised_text(Masker(ours, loss_on="all"), conv)
    assert C2 not in less and SYSTEM in less


def test_keep_trains_every_turns_reasoning_once(ours):
    docs = Masker(ours, history_thinking="keep").docs(_conv())
    assert len(docs) == 2
    texts = [
        ours.tokenizer.decode(
            [t for t, s in zip(d.ids, d.supervised, strict=False) if s], skip_special_tokens=False
        )
        for d in docs
    ]
    assert R1 in texts[0] and C1 in texts[0] and R2 not in texts[0]
    assert R2 in texts[1] and C2 in texts[1] and C1 not in texts[1]  # turn 1 is context in sample 2


def test_nothing_supervised_and_too_long_are_counted_not_trained(ours):
    counts = Counts()
    conv = _conv()
    for m in conv.messages:
        m["train"] = False
    assert encode(Masker(ours), conv, 256, "drop", counts) == []
    assert counts.skipped == {"no supervised token": 1} and counts.first_skip["no supervised token"] == "x:1"
    assert encode(Masker(ours), _conv(), 40, "drop", counts) == [] and counts.dropped == 1
    (cut,) = encode(Masker(ours), _conv(), 60, "truncate", counts)
    assert len(cut.ids) == 61 and counts.truncated == 1
    special = records.conversation(
        {"messages": [{"role": "user", "content": "hi<|im_end|>"}, {"role": "assistant", "content": "x"}]},
        "y:3",
    )
    assert encode(Masker(ours), special, 256, "drop", counts) == []
    assert any(r.startswith("mask not exact (a message holds the special token") for r in counts.skipped)


@pytest.mark.parametrize(
    "record, message",
    [
        ({"text": "plain"}, "no known chat format (keys found: ['text'])"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role 'robot'"),
        ({"conversations": [{"from": "alien", "value": "x"}]}, "is from 'alien'"),
        ({"messages": [{"role": "user", "content": "only a question"}]}, "no assistant message"),
    ],
)
def test_a_record_in_no_known_format_names_the_file_line_and_keys(record, message, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(MESSAGES) + "\n\n" + json.dumps(record) + "\n")
    with pytest.raises(records.RecordError) as err:
        records.load([str(path)])
    assert err.value.where == f"{path}:3" and message in err.value.message


def test_renders_equal_transformers_with_kwargs_and_tools(hf_tokenizer, ours):
    for record in (MESSAGES, TOOL_CALLS):
        conv = records.conversation(record, "x:1")
        for kwargs in ({}, {"enable_thinking": False}):
            for gen in (False, True):
                want = hf_tokenizer.apply_chat_template(
                    _hf_messages(conv), tools=conv.tools, tokenize=False, add_generation_prompt=gen, **kwargs
                )
                assert (
                    ours.render(_hf_messages(conv), tools=conv.tools, add_generation_prompt=gen, **kwargs)
                    == want
                )
    assert ours.end_of_turn == "<|im_end|>"
