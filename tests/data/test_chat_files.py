"""Chat record files as users have them: not UTF-8, JSON Lines in a ``.json`` file, line
separators inside strings, a broken Parquet file or a broken link in a Hub snapshot. Each is read
as the ``datasets`` library reads it (the oracle: ``load_dataset("json", ...)`` on the same file),
or refused naming the file and line, never with a traceback, in pre-flight as in the dry run."""

from __future__ import annotations

import json
import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT

from qwen3_trainium.data.chat import records


def _record(i: int, user: str = "Hi") -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"{user} {i}"},
            {"role": "assistant", "content": f"Hello {i}"},
        ]
    }


def _jsonl(records_: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records_)


def _latin1_file(path) -> int:
    """Three UTF-8 lines, then one written in Latin-1; the byte offset of its 'é'."""
    raw = _jsonl([_record(i) for i in range(3)]).encode() + _jsonl([_record(3, "Café?")]).encode("latin-1")
    path.write_bytes(raw)
    return raw.index(b"\xe9")


def _as_datasets_reads_it(path, tmp_path) -> list[dict]:
    from datasets import load_dataset

    return load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "ds")).to_list()


def test_a_file_not_in_utf8_is_refused_at_its_line_and_byte_with_the_iconv_line(tmp_path):
    path = tmp_path / "chats.jsonl"
    offset = _latin1_file(path)
    with pytest.raises(records.RecordError) as err:
        records.load([str(path)])
    assert err.value.where == f"{path}:4"
    assert f"byte 0xe9 at byte offset {offset} is not UTF-8" in err.value.message
    assert "iconv -f latin1 -t utf-8" in err.value.fix and err.value.fix in err.value.message


@pytest.mark.skipif(shutil.which("iconv") is None, reason="no iconv on this machine")
def test_the_iconv_line_the_refusal_prints_makes_the_file_readable(tmp_path):
    path = tmp_path / "chats.jsonl"
    _latin1_file(path)
    with pytest.raises(records.RecordError) as err:
        records.load([str(path)])
    command = err.value.fix.split(": ", 1)[1].split(" (text from Windows")[0]
    subprocess.run(command, shell=True, check=True)
    assert [c.messages[0]["content"] for c in records.load([str(path)])][-1] == "Café? 3"


def test_utf16_is_refused_naming_utf16_and_a_utf8_byte_order_mark_is_read(tmp_path):
    utf16, bom = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    utf16.write_bytes(_jsonl([_record(0)]).encode("utf-16"))  # what Windows PowerShell's `>` writes
    bom.write_bytes(b"\xef\xbb\xbf" + _jsonl([_record(0)]).encode())
    with pytest.raises(records.RecordError) as err:
        records.load([str(utf16)])
    assert err.value.where == f"{utf16}:1" and "iconv -f utf-16 -t utf-8" in err.value.fix
    assert records.load([str(bom)])[0].messages[0]["content"] == "Hi 0"


@pytest.mark.parametrize("name", ["lines.json", "list.jsonl", "list.json", "lines.jsonl"])
def test_json_and_jsonl_files_are_read_in_both_forms_as_datasets_reads_them(name, tmp_path):
    rows = [_record(i) for i in range(3)]
    path = tmp_path / name
    path.write_text(json.dumps(rows, indent=1) if name.startswith("list") else _jsonl(rows))
    loaded = records.load([str(path)])
    assert [c.messages for c in loaded] == [r["messages"] for r in _as_datasets_reads_it(path, tmp_path)]
    assert loaded[2].where == (f"{path}:3" if name.startswith("lines") else f"{path}:record 3")


def test_a_line_separator_inside_a_string_does_not_cut_the_record(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text(_jsonl([_record(0, "one\u2028two\x85three"), _record(1)]))  # json.dumps leaves these raw
    loaded = records.load([str(path)])
    assert [c.messages for c in loaded] == [r["messages"] for r in _as_datasets_reads_it(path, tmp_path)]
    assert loaded[0].messages[0]["content"] == "one\u2028two\x85three 0" and loaded[1].where == f"{path}:2"


def test_a_json_file_in_neither_form_names_the_line_the_reading_stopped_at(tmp_path):
    lines, pretty = tmp_path / "lines.json", tmp_path / "pretty.json"
    lines.write_text(_jsonl([_record(0), _record(1)]) + json.dumps(_record(2))[:-2] + "\n")
    pretty.write_text(json.dumps(_record(0), indent=2).replace('"Hello 0"', '"Hello 0",'))
    for path, line in ((lines, 3), (pretty, 10)):
        with pytest.raises(records.RecordError) as err:
            records.load([str(path)])
        assert err.value.where == f"{path}:{line}" and "JSON Lines" in err.value.message
    from datasets.exceptions import DatasetGenerationError

    with pytest.raises((ValueError, DatasetGenerationError)):  # datasets refuses the first too
        _as_datasets_reads_it(lines, tmp_path)
    pretty.write_text(json.dumps(_record(0), indent=2))  # one pretty-printed record is that record
    assert [c.where for c in records.load([str(pretty)])] == [f"{pretty}:record 1"]


def test_a_parquet_file_that_is_broken_or_not_utf8_names_the_file_and_row(tmp_path):
    bad, cut = tmp_path / "bad.parquet", tmp_path / "cut.parquet"
    text = pa.array([b"Hi", b"Caf\xe9"], pa.binary()).view(pa.string())  # bytes that are not UTF-8
    pq.write_table(pa.table({"prompt": text, "completion": ["Hello", "Oui"]}), bad)
    cut.write_bytes(bad.read_bytes()[:40])
    with pytest.raises(records.RecordError) as err:
        records.load([str(bad)])
    assert err.value.where == f"{bad}:row 2" and "0xe9" in err.value.message
    with pytest.raises(records.RecordError) as err:
        records.load([str(cut)])
    assert err.value.where == str(cut) and "not a readable Parquet file" in err.value.message


def test_a_bad_byte_or_line_in_a_directory_names_its_file(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train-a.jsonl").write_text(_jsonl([_record(0)]))
    _latin1_file(tmp_path / "d" / "train-b.jsonl")
    (tmp_path / "d" / "train-c.json").symlink_to(tmp_path / "blobs" / "missing")  # a partial download
    files = records.split_files(str(tmp_path / "d"))["train"]
    with pytest.raises(records.RecordError) as err:
        records.load(files)
    assert err.value.where == f"{tmp_path / 'd' / 'train-b.jsonl'}:4"
    with pytest.raises(records.RecordError) as err:
        records.load([files[0], files[2]])
    assert err.value.where == files[2] and "cannot be read" in err.value.message


def test_the_dry_run_refuses_a_file_not_in_utf8_with_the_iconv_line_as_its_fix_and_no_traceback(
    tmp_path, dry_run
):
    path = tmp_path / "chats.jsonl"
    _latin1_file(path)
    (status, code), out, err = dry_run(
        ROOT, tmp_path / "run", "data=chat", "smoke=on", f"data.dataset_path={path}"
    )
    assert (status, code) == ("failed", 2), err
    assert f"{path}:4" in err and "Traceback" not in err + out
    fix = next(line for line in err.splitlines() if line.strip().startswith("fix:"))
    assert "iconv -f latin1 -t utf-8" in fix and "messages, conversations" not in fix  # not the format's fix
