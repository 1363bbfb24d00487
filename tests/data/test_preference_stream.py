"""Rows of preference pairs: a pair never split, chosen before rejected, the segment and pair keys
consistent with the labels, an exact resume, a refused resume on other data, one pair a row with
packing off, and the loader's and the reference pre-pass's batches (``pair_rows``)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from conftest import resolve

from qwen3_trainium.data.chat.loader import MASK_KEY
from qwen3_trainium.data.chat.masks import IGNORE_INDEX, Doc
from qwen3_trainium.data.preference import PAIR_KEY, SEGMENT_KEY, max_pairs, source
from qwen3_trainium.data.preference.loader import pair_rows
from qwen3_trainium.data.preference.masks import MASK_RULE, PairDocs
from qwen3_trainium.data.preference.stream import PairStream

IDENTITY = {"records": "r", "seq_len": 24, "packing": True, "seed": 42, "masks": MASK_RULE}


def _pairs(n: int, seed: int = 0, longest: int = 12):
    """Record i: a pair whose tokens are 1000 i + 100 s + position (s: 0 chosen, 1 rejected), of
    random lengths; its last half supervised; every 5th record gives none (dropped)."""
    rng = random.Random(seed)
    sizes = [(rng.randint(2, longest), rng.randint(2, longest)) for _ in range(n)]

    def encode(i: int) -> PairDocs | None:
        if i % 5 == 4:
            return None
        docs = [
            Doc([1000 * i + 100 * s + j for j in range(m)], [j >= m // 2 for j in range(m)])
            for s, m in enumerate(sizes[i])
        ]
        return PairDocs(docs[0], docs[1], sizes[i][0] // 2)

    return encode


def _check_row(row, seq_len: int) -> list[int]:
    """The row's record indices, after checking the row against its own ids (1000 i + 100 s + j)."""
    assert len(row.input_ids) == len(row.labels) == len(row.positions) == len(row.segment) == seq_len
    assert len(row.pairs) == max_pairs(seq_len)
    starts = [t for t in range(row.real) if row.positions[t] == 0]
    assert len(starts) == row.documents == 2 * row.n_pairs
    assert row.pairs[row.n_pairs :] == [-1] * (max_pairs(seq_len) - row.n_pairs)
    for d, (a, b) in enumerate(zip(starts, starts[1:] + [row.real], strict=True)):
        j, side = divmod(d, 2)
        record = row.pairs[j]
        assert row.input_ids[a:b] == [1000 * record + 100 * side + t for t in range(b - a)], "whole, in order"
        assert row.positions[a:b] == list(range(b - a))
        for t in range(a, b):
            assert row.segment[t] == (2 * j + side if row.labels[t] != IGNORE_INDEX else -1)
            if row.labels[t] != IGNORE_INDEX:
                assert row.labels[t] == row.input_ids[t] + 1, "the next token of its own document"
    assert row.labels[row.real :] == [IGNORE_INDEX] * (seq_len - row.real)
    assert row.segment[row.real :] == [-1] * (seq_len - row.real)
    return row.pairs[: row.n_pairs]


@pytest.mark.parametrize("seed", range(6))
def test_pairs_are_never_split_and_the_keys_match_the_labels(seed):
    seq_len = random.Random(seed).choice([22, 24, 31, 40, 64])
    n = 40
    seen = []
    for rank in range(2):
        stream = PairStream(n, _pairs(n, seed), seq_len=seq_len, pad_id=0, rank=rank, world=2, infinite=False)
        rows = list(iter(stream.next_row, None))
        seen += [r for row in rows for r in _check_row(row, seq_len)]
        assert any(row.n_pairs > 1 for row in rows), "packed"
    assert sorted(seen) == [i for i in range(n) if i % 5 != 4], "every pair once an epoch, over the ranks"


def test_packing_off_gives_one_pair_a_row():
    stream = PairStream(20, _pairs(20), seq_len=24, pad_id=0, packing=False, infinite=False)
    rows = list(iter(stream.next_row, None))
    assert [row.n_pairs for row in rows] == [1] * 16
    assert all(_check_row(row, 24) for row in rows)


@pytest.mark.parametrize("packing", [True, False])
def test_a_stream_resumed_from_its_state_reads_the_same_rows(packing):
    def make():
        return PairStream(9, _pairs(9), seq_len=24, pad_id=0, packing=packing, identity=IDENTITY)

    straight = make()
    first = [straight.next_row() for _ in range(4)]
    state = json.loads(json.dumps(straight.state_dict()))  # what a checkpoint keeps survives a round trip
    later = [straight.next_row() for _ in range(12)]  # crosses epochs
    resumed = make()
    resumed.load_state_dict(state)
    assert [resumed.next_row() for _ in range(12)] == later and first != later[:4]
    if packing:
        assert state["pending"], "a pair read but not placed is carried over"


@pytest.mark.parametrize(
    "saved, says",
    [
        ({**IDENTITY, "masks": "dpo: another rule"}, "objective.kind"),
        ({k: v for k, v in IDENTITY.items() if k != "masks"}, "another stream"),  # a chat SFT state
        ({**IDENTITY, "seq_len": 32}, "training.seq_len"),
    ],
    ids=["mask_rule", "chat_state", "seq_len"],
)
def test_a_resume_on_other_data_is_refused(saved, says):
    stream = PairStream(9, _pairs(9), seq_len=24, pad_id=0, identity=IDENTITY)
    stream.next_row()
    with pytest.raises(ValueError, match=says):
        PairStream(9, _pairs(9), seq_len=24, pad_id=0, identity=IDENTITY).load_state_dict(
            {**stream.state_dict(), "identity": saved}
        )


def test_pair_rows_cover_a_ranks_share_once_in_padded_batches():
    run = resolve("objective=dpo", "smoke=on", "training.local_batch_size=3")
    records = source.records(run)
    seen = []
    for rank in range(2):
        batches = list(pair_rows(run, "train", rank=rank, world=2))
        for inputs, labels in batches:
            assert labels.shape == inputs["input"].shape == inputs[SEGMENT_KEY].shape == (3, 256)
            assert inputs[PAIR_KEY].shape == (3, 128) and MASK_KEY in inputs
            assert ((inputs[SEGMENT_KEY] >= 0) == (labels != IGNORE_INDEX)).all()
        rows = len(list(iter(source.stream(run, rank=rank, world=2, infinite=False).next_row, None)))
        assert len(batches) == -(-rows // 3)
        padding = 3 * len(batches) - rows
        inputs, labels = batches[-1]
        assert (inputs[PAIR_KEY][3 - padding :] == -1).all() and (labels[3 - padding :] == IGNORE_INDEX).all()
        assert (inputs[PAIR_KEY][: 3 - padding, 0] >= 0).all()
        seen += [int(p) for inputs, _ in batches for p in inputs[PAIR_KEY].flatten() if p >= 0]
    assert sorted(seen) == list(range(len(records))), "every record of the split once"


def test_the_loaders_yield_the_contracts_rows(tmp_path):
    from qwen3_trainium.data.loaders import dataloaders
    from qwen3_trainium.data.preference.loader import PreferenceDataLoader
    from qwen3_trainium.parent import compose

    run = resolve("objective=dpo", "smoke=on", "eval=on")
    compose.save(run, str(tmp_path))
    train, val = dataloaders(run, str(tmp_path))
    assert isinstance(train, PreferenceDataLoader.Config) and isinstance(val, PreferenceDataLoader.Config)
    for config, masked in ((train, True), (dataclasses.replace(val, infinite=True), False)):
        loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=256, local_batch_size=2)
        inputs, labels = next(iter(loader))
        assert set(inputs) == {"input", "positions", SEGMENT_KEY, PAIR_KEY} | (
            {MASK_KEY} if masked else set()
        )
        assert labels.shape == (2, 256) and inputs[PAIR_KEY].shape == (2, 128)
        assert ((inputs[SEGMENT_KEY] >= 0) == (labels != IGNORE_INDEX)).all() and (
            inputs[PAIR_KEY][:, 0] >= 0
        ).all()


def test_the_shipped_corpus_counts_and_preview(tmp_path):
    run = resolve("objective=dpo", "smoke=on", "eval=on")
    summary = source.summarise(run)
    c = summary.counts
    assert (summary.total, c.records, c.pairs, c.dropped, c.truncated, c.skipped) == (400, 400, 400, 0, 0, {})
    assert 0.2 < c.completion / c.tokens < 0.6 and summary.rows < 400
    assert source.summarise(run, "validation").counts.pairs == 40
    unpacked = resolve("objective=dpo", "smoke=on", "data.packing=false")
    assert source.summarise(unpacked).rows == 400
    md, jsonl = source.write_preview(run, str(tmp_path), 2)
    rows = [json.loads(line) for line in open(jsonl)]
    assert len(rows) == 2 and all(len(r["segment"]) == 256 and len(r["pairs"]) == 128 for r in rows)
    text = open(md).read()
    assert text.count("## Row") == 2 and "chosen:" in text and "rejected:" in text
    assert "<|im_end|>\n⟧" in text, "TRL's completion runs to the end of the render"


def test_at_64_data_parallel_ranks_every_pair_is_scored_once_held_out_ones_too():
    """The regime a trn2 runs (FSDP 64): the reference pre-pass's rows (pair_rows) cover each
    record of both splits exactly once, the 40 held-out pairs too, though 24 ranks get none."""
    from qwen3_trainium.data.preference import source
    from qwen3_trainium.data.preference.loader import pair_rows

    run = resolve("objective=dpo", "smoke=on", "eval=on")
    for split in ("train", "validation"):
        got = [
            int(p)
            for rank in range(64)
            for inputs, _ in pair_rows(run, split, rank, 64)
            for p in inputs[PAIR_KEY].flatten()
            if p >= 0
        ]
        assert sorted(got) == list(range(len(source.records(run, split)))), split
