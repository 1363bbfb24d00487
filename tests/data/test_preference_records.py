"""Preference records: TRL's formats read (implicit prompts by TRL's own ``extract_prompt``, JSON
Lines, a JSON document, Parquet), and every bad record refused with its file and line."""

from __future__ import annotations

import json

import pytest

from qwen3_trainium.data.chat.record_files import RecordError
from qwen3_trainium.data.preference import records as rec

Q, A = {"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "5."}
B = {"role": "assistant", "content": "99."}
GOOD = {"prompt": [Q], "chosen": [A], "rejected": [B]}
TOOL = {"role": "tool", "content": "5"}

# name -> (record, what the refusal says)
BAD = {
    "no_rejected": ({"prompt": "q", "chosen": "a"}, "not a preference record"),
    "chat_record": ({"messages": [Q, A]}, "not a preference record"),
    "not_a_mapping": (["q", "a", "b"], "not a preference record"),
    "mixed_string_and_messages": (
        {"prompt": "q", "chosen": [A], "rejected": [B]},
        "mixes strings and message",
    ),
    "a_number": ({"prompt": "q", "chosen": 5, "rejected": "b"}, "chosen is int"),
    "equal_sides": ({"prompt": [Q], "chosen": [A], "rejected": [A]}, "chosen equals rejected"),
    "implicit_equal": ({"chosen": "q a", "rejected": "q a"}, "chosen equals rejected"),
    "implicit_prefix_string": ({"chosen": "abc", "rejected": "abcd"}, "prefix of the other"),
    "implicit_prefix_messages": ({"chosen": [Q, A], "rejected": [Q, A, Q, B]}, "prefix of the other"),
    "implicit_empty_side": ({"chosen": "", "rejected": "abc"}, "empty"),
    "implicit_no_common_prefix": ({"chosen": [Q, A], "rejected": [B, A]}, "no common prefix"),
    "side_ends_with_tool": (
        {"prompt": [Q], "chosen": [A, TOOL], "rejected": [B]},
        "ends with a tool message",
    ),
    "side_holds_user": ({"prompt": [Q], "chosen": [A], "rejected": [Q, B]}, "holds a user message"),
    "empty_side": ({"prompt": [Q], "chosen": [], "rejected": [B]}, "chosen is empty"),
    "bad_role": (
        {"prompt": [Q], "chosen": [{"role": "robot", "content": "5."}], "rejected": [B]},
        "role 'robot'",
    ),
    "no_role": ({"prompt": [{"content": "hi"}], "chosen": [A], "rejected": [B]}, "has no role"),
    "prompt_ends_with_assistant": (
        {"prompt": [Q, A], "chosen": [A], "rejected": [B]},
        "prompt ends with an assistant",
    ),
    "empty_prompt": ({"prompt": [], "chosen": [A], "rejected": [B]}, "prompt has no message"),
    "kwargs_not_a_mapping": ({**GOOD, "chat_template_kwargs": 3}, "chat_template_kwargs is int"),
    "tools_not_json": ({**GOOD, "tools": "[{"}, "not JSON"),
    "tools_not_a_list": ({**GOOD, "tools": {"name": "f"}}, "tools is dict"),
}


def _write(path, records: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_record_is_refused_with_its_file_and_line(case, tmp_path):
    record, what = BAD[case]
    path = _write(tmp_path / "pairs.jsonl", [GOOD, record, GOOD])
    with pytest.raises(RecordError) as e:
        rec.load([path])
    assert e.value.where == f"{path}:2"
    assert what in e.value.what


@pytest.mark.parametrize(
    "record",
    [
        {"chosen": [Q, A], "rejected": [Q, B]},
        {
            "chosen": [{"role": "system", "content": "x"}, Q, A, Q, A],
            "rejected": [{"role": "system", "content": "x"}, Q, A, Q, B],
        },
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "What is 2 plus 3? 5.", "rejected": "What is 2 plus 3? 99."},
    ],
    ids=["messages", "multi_turn", "string_space", "string"],
)
def test_an_implicit_prompt_is_trls_extract_prompt(record):
    trl = pytest.importorskip("trl")
    pair = rec.pair(record, "x:1")
    expected = trl.extract_prompt(record)
    if isinstance(record["chosen"], str):  # strings as chat: a user prompt, assistant responses
        roles = {"prompt": "user", "chosen": "assistant", "rejected": "assistant"}
        expected = {k: [{"role": roles[k], "content": v}] for k, v in expected.items()}
    assert (pair.prompt, pair.chosen, pair.rejected) == (
        expected["prompt"],
        expected["chosen"],
        expected["rejected"],
    )


def test_strings_tools_and_template_kwargs_are_read_as_trl_reads_them():
    tools = [{"type": "function", "function": {"name": "add"}}]
    pair = rec.pair(
        {
            "prompt": "q",
            "chosen": "a",
            "rejected": "b",
            "tools": json.dumps(tools),
            "chat_template_kwargs": {"enable_thinking": False},
        },
        "x:1",
    )
    assert pair.prompt == [{"role": "user", "content": "q"}]
    assert pair.chosen == [{"role": "assistant", "content": "a"}] and pair.tools == tools
    assert pair.kwargs == {"enable_thinking": False}
    assert rec.pair({**GOOD, "chosen": [A, TOOL, A]}, "x:1").chosen == [A, TOOL, A], (
        "a response may use tools"
    )


def test_json_documents_parquet_and_directories_are_read_as_chat_reads_them(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    strings = {"prompt": "q", "chosen": "a", "rejected": "b"}
    (tmp_path / "doc.json").write_text(json.dumps([GOOD, strings]))
    pq.write_table(pa.Table.from_pylist([strings, strings]), tmp_path / "rows.parquet")
    pairs = rec.load([str(tmp_path / "doc.json"), str(tmp_path / "rows.parquet")])
    assert [p.where for p in pairs] == [
        f"{tmp_path}/doc.json:record 1",
        f"{tmp_path}/doc.json:record 2",
        f"{tmp_path}/rows.parquet:row 1",
        f"{tmp_path}/rows.parquet:row 2",
    ]
    assert pairs[0].chosen == [A] and pairs[3].rejected == [{"role": "assistant", "content": "b"}]
    pq.write_table(pa.Table.from_pylist([strings, {**strings, "rejected": "a"}]), tmp_path / "bad.parquet")
    with pytest.raises(RecordError, match="chosen equals rejected") as e:
        rec.load([str(tmp_path / "bad.parquet")])
    assert e.value.where == f"{tmp_path}/bad.parquet:row 2"
