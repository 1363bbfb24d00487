"""Where chat records come from: a file, a directory split by file names, and a Hub dataset in
the local cache, laid out as the Hub's cache lays it out (``datasets--org--name/refs/main`` and
``snapshots/<commit>/data/<split>-00000-of-00001.parquet``), read with no network."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, resolve

from qwen3_trainium.data.chat import records, source

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _record(i: int) -> dict:
    q = f"What is {i} plus 1?"
    return {
        "prompt": q,
        "prompt_id": f"id{i}",
        "messages": [
            {"role": "user", "content": q},
            {"role": "assistant", "content": f"{i} plus 1 is {i + 1}."},
        ],
    }


def _hub_cache(root, repo: str = "q3t/chat-sft") -> str:
    org, name = repo.split("/")
    base = root / f"datasets--{org}--{name}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(COMMIT)
    data = base / "snapshots" / COMMIT / "data"
    data.mkdir(parents=True)
    for split, n in (("train_sft", 40), ("test_sft", 5)):
        pq.write_table(
            pa.Table.from_pylist([_record(i) for i in range(n)]), data / f"{split}-00000-of-00001.parquet"
        )
    (base / "snapshots" / COMMIT / "README.md").write_text("---\nlicense: mit\n---\n")
    return repo


def test_a_cached_hub_dataset_trains_from_its_train_split_offline(tmp_path, monkeypatch, dry_run):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    # read at import: an earlier test may have imported huggingface_hub already
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = _hub_cache(tmp_path / "hub")
    snapshot = records.resolve(repo)
    assert snapshot and snapshot.endswith(COMMIT)
    splits = records.split_files(snapshot)
    assert [p.rsplit("/", 1)[1] for p in splits["train"]] == ["train_sft-00000-of-00001.parquet"]
    assert splits["validation"] == []  # test_sft is neither trained on nor held out
    run = resolve("data=chat", f"data.dataset_path={repo}", "eval=on")
    assert len(source.conversations(run, "train")) == 38 and len(source.conversations(run, "validation")) == 2
    (status, code), out, err = dry_run(
        ROOT, tmp_path / "run", "data=chat", "smoke=on", f"data.dataset_path={repo}"
    )
    assert (status, code) == ("dry_run", 0), err
    assert "chat data: 40 records: 40 samples" in out
    (status, code), out, err = dry_run(
        ROOT, tmp_path / "run2", "data=chat", "smoke=on", "data.dataset_path=q3t/not-cached"
    )
    assert (status, code) == ("failed", 2) and "no Hub dataset in the local cache" in err


def test_a_directory_is_split_by_file_names_and_a_file_is_all_train(tmp_path):
    (tmp_path / "d").mkdir()
    for name, n in (
        ("train.jsonl", 6),
        ("dev.json", 2),
        ("test.jsonl", 3),
        (".hidden.jsonl", 1),
        ("notes.txt", 1),
    ):
        rows = [_record(i) for i in range(n)]
        text = json.dumps(rows) if name.endswith(".json") else "".join(json.dumps(r) + "\n" for r in rows)
        (tmp_path / "d" / name).write_text(text)
    splits = records.split_files(str(tmp_path / "d"))
    assert [p.rsplit("/", 1)[1] for p in splits["train"]] == ["train.jsonl"]
    assert [p.rsplit("/", 1)[1] for p in splits["validation"]] == ["dev.json"]
    assert len(records.load(splits["validation"])) == 2 and records.load(splits["validation"])[
        1
    ].where.endswith("dev.json:record 2")
    one = tmp_path / "d" / "train.jsonl"
    assert records.split_files(str(one)) == {"train": [str(one)], "validation": []}
    run = resolve("data=chat", f"data.dataset_path={one}", "eval=on", "data.validation_fraction=0.5")
    train, held = source.conversations(run, "train"), source.conversations(run, "validation")
    assert len(train) == len(held) == 3 and not {c.where for c in train} & {c.where for c in held}


def test_a_cached_hub_dataset_with_a_bad_byte_or_a_missing_blob_names_the_snapshot_file(
    tmp_path, monkeypatch
):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "datasets--q3t--chats" / "snapshots" / COMMIT
    (snapshot / "data").mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(COMMIT)
    bad = snapshot / "data" / "train.jsonl"
    bad.write_bytes(
        json.dumps(_record(0)).encode()
        + b"\n"
        + json.dumps(_record(1)).replace("1", "\xb9").encode("latin-1")
    )
    files = records.split_files(records.resolve("q3t/chats"))["train"]
    with pytest.raises(records.RecordError) as err:
        records.load(files)
    assert err.value.where == f"{bad}:2" and "iconv" in err.value.fix
    bad.unlink()
    bad.symlink_to(snapshot.parents[1] / "blobs" / "0123")  # the Hub's layout, the blob never came
    with pytest.raises(records.RecordError) as err:
        records.load(records.split_files(records.resolve("q3t/chats"))["train"])
    assert err.value.where == str(bad) and "cannot be read" in err.value.message
