"""The data path at 1, 2, 8, 64 and 128 data-parallel ranks, in process: rank r of w built with
the functions the ranks call (chat: ``RowStream`` / ``source.stream`` / ``ChatDataLoader``; text:
``TextRows``, torchtitan's ``HuggingFaceTextDataset``), on one-record, small, uneven and larger
data. Every rank gets rows or pre-flight refuses with the numbers; no rank stops or loops for lack
of data; held-out rows are each scored once, and pre-flight's per-rank figures are the ranks' own."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import resolve

from qwen3_trainium.data import shares as data_shares
from qwen3_trainium.data.chat import source
from qwen3_trainium.data.chat.masks import IGNORE_INDEX, Doc
from qwen3_trainium.data.chat.stream import RowStream, shares
from qwen3_trainium.parent.preflight.shares import unfed_ranks

WORLDS = (1, 2, 8, 64, 128)
SIZES = (1, 3, 60, 100, 600)  # one record, fewer than ranks, the old crash case (60 on 64), uneven, more


def _docs(i: int) -> list[Doc]:
    """Record i: one sample of i % 7 + 3 tokens, ids 100 * i + j, the second half supervised."""
    length = i % 7 + 3
    return [Doc([100 * i + j for j in range(length)], [j >= length // 2 for j in range(length)])]


def _handed(n: int, world: int) -> list[int]:
    """Records rank r reads each epoch, by hand: r, r + w, ... below n."""
    return [len(range(r, n, world)) for r in range(world)]


def _records(row) -> set[int]:
    return {t // 100 for t in row.input_ids[: row.real]}


def _first_epoch(n: int, rank: int, world: int) -> list[set[int]]:
    """The records of each row rank ``rank`` reads in the first epoch."""
    stream = RowStream(n, _docs, seq_len=16, pad_id=0, rank=rank, world=world, infinite=False)
    return [_records(row) for row in iter(stream.next_row, None)]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("n", SIZES)
def test_chat_training_every_rank_reads_its_records_or_preflight_refuses(n, world):
    found = shares(n, _docs, seq_len=16, packing=True, world=world, seed=42)
    assert found.records == _handed(n, world)
    problems = unfed_ranks(found, "data.dataset_path", "/data", "training records")
    if n < world:
        assert [p.key for p in problems] == ["data.dataset_path"]
        assert f"{n} training records over {world} data-parallel ranks" in problems[0].message
        assert f"{world - 1} would be handed none" in problems[0].message
        assert f"at least {world} training records" in problems[0].fix and f"at most {n} " in problems[0].fix
        with pytest.raises(RuntimeError, match="is handed none of the"):  # the rank's own guard, at once
            RowStream(n, _docs, seq_len=16, pad_id=0, rank=world - 1, world=world).next_row()
        return
    assert problems == []
    per_rank = [_first_epoch(n, r, world) for r in range(world)]
    read = [set().union(*rows) for rows in per_rank]
    assert [len(r) for r in read] == _handed(n, world)
    assert set().union(*read) == set(range(n)) and sum(map(len, read)) == n  # disjoint, all of them
    assert found.rows == [len(rows) for rows in per_rank]  # pre-flight's figures are the ranks' own
    for rank in range(world):  # the training stream loops: three epochs' worth for a one-record share
        stream = RowStream(n, _docs, seq_len=16, pad_id=0, rank=rank, world=world)
        assert all(_records(stream.next_row()) for _ in range(3 * len(per_rank[rank])))


def test_a_chat_rank_whose_epoch_gives_no_sample_reads_on_instead_of_stopping():
    """64 records on 64 ranks, one in eight trainable: most epochs give a rank nothing. The old
    stream raised after two such epochs running; a rank must read on to its trainable records."""

    def sparse(i: int) -> list[Doc]:
        return _docs(i) if i % 8 == 0 else []

    for rank in range(64):
        stream = RowStream(64, sparse, seq_len=16, pad_id=0, rank=rank, world=64)
        rows = [stream.next_row() for _ in range(20)]
        assert all(_records(row) <= set(range(0, 64, 8)) for row in rows)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("n", SIZES)
def test_chat_held_out_every_rank_runs_its_batches_and_each_row_is_scored_once(n, world):
    steps = 8  # eval.steps x local_batch_size rows, on every rank
    scored: list[int] = []
    for rank in range(world):
        stream = RowStream(
            n, _docs, seq_len=16, pad_id=0, rank=rank, world=world, infinite=False, pad_when_spent=True
        )
        rows = [stream.next_row() for _ in range(steps)]
        assert all(row is not None and len(row.input_ids) == 16 for row in rows)
        for row in rows:
            if row.real == 0:  # padding: no label, nothing to score
                assert row.labels == [IGNORE_INDEX] * 16 and row.documents == 0
            scored += sorted(_records(row))
    assert len(scored) == len(set(scored)), "no held-out record scored twice"
    shares = [_first_epoch(n, r, world) for r in range(world)]
    if all(len(rows) <= steps for rows in shares):
        assert sorted(scored) == list(range(n))


def _supervised(rows) -> int:
    return sum(label >= 0 for row in rows for label in row.labels)


@pytest.mark.parametrize("world", [64, 128])
def test_the_shipped_60_held_out_chat_records_on_64_and_128_ranks(world):
    """The old crash: 60 held-out records on 64 ranks left ranks 60-63 with none, and their
    stream raised at the first validation. Every rank now runs the smoke run's 2 batches, and the
    supervised tokens scored over all ranks are those of one rank reading the whole split once."""
    run = resolve("data=chat", "smoke=on", "eval=on")
    assert len(source.conversations(run, "validation")) == 60
    total = 0
    for rank in range(world):
        stream = source.stream(
            run, "validation", rank=rank, world=world, infinite=True
        )  # the Validator's ask
        total += _supervised(
            [stream.next_row() for _ in range(run.eval.steps * run.training.local_batch_size)]
        )
    whole = source.stream(run, "validation", infinite=False)
    assert total == _supervised(iter(whole.next_row, None)) > 0


def test_a_held_out_stream_asked_for_more_rows_than_it_holds_scores_none_twice():
    """One rank, 60 held-out conversations in 33 rows, 40 rows asked (the Validator asks an
    infinite loader): the 7 beyond are padding, not the first rows again."""
    run = resolve("data=chat", "smoke=on", "eval=on")
    whole = list(iter(source.stream(run, "validation", infinite=False).next_row, None))
    asked = source.stream(run, "validation", infinite=True)
    rows = [asked.next_row() for _ in range(len(whole) + 7)]
    assert rows[: len(whole)] == whole and _supervised(rows) == _supervised(whole)
    assert all(row.real == 0 for row in rows[len(whole) :])


def test_the_validators_chat_loader_at_rank_63_of_64_gives_padding_batches(tmp_path):
    from qwen3_trainium.data.chat.loader import ChatDataLoader
    from qwen3_trainium.data.loaders import dataloaders
    from qwen3_trainium.parent import compose

    run = resolve("data=chat", "smoke=on", "eval=on")
    compose.save(run, str(tmp_path))
    _, val = dataloaders(run, str(tmp_path))
    assert isinstance(val, ChatDataLoader.Config)
    val = dataclasses.replace(val, infinite=True)  # torchtitan's Validator: infinite when eval.steps is set
    loader = val.build(dp_world_size=64, dp_rank=63, tokenizer=None, seq_len=256, local_batch_size=1)
    batches = [batch for batch, _ in zip(loader, range(3), strict=False)]
    assert len(batches) == 3
    for inputs, labels in batches:
        assert inputs["input"].shape == labels.shape == (1, 256) and (labels == IGNORE_INDEX).all()


# -- text: torchtitan's HuggingFaceTextDataset (TextRows), its records split by split_dataset_by_node


@pytest.fixture
def texts():
    """A registered in-memory text dataset of n records (lengths 3 to 9 words), and the tokenizer."""
    from datasets import Dataset
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    from qwen3_trainium.data import assets

    made = {}

    def make(n: int, text=lambda i: " ".join(["word"] * (i % 7 + 3))) -> str:
        made[n] = Dataset.from_dict({"text": [text(i) for i in range(n)]})
        name = f"q3t_test_texts_{n}"
        DATASETS[name] = DatasetConfig(
            path="", loader=lambda _: made[n], sample_processor=lambda s: s["text"]
        )
        return name

    tok = HuggingFaceTokenizer.Config().build(tokenizer_path=str(assets.TOKENIZER_DIR))
    yield make, made, tok
    for n in made:
        DATASETS.pop(f"q3t_test_texts_{n}", None)


def _text_rows(name, tok, rank, world, **kw):
    from qwen3_trainium.data.text import TextRows

    return TextRows(
        dataset_name=name,
        dataset_path=None,
        tokenizer=tok,
        seq_len=8,
        dp_rank=rank,
        dp_world_size=world,
        **kw,
    )


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("n", SIZES)
def test_text_training_every_rank_gets_rows_or_preflight_refuses(texts, n, world):
    make, made, tok = texts
    name = make(n)
    encode = lambda sample: tok.encode(sample["text"], add_bos=True, add_eos=True)  # noqa: E731
    found = data_shares.text(made[n], encode, seq_len=8, world=world, limit=1)
    assert found.records == [n // world + (r < n % world) for r in range(world)]  # contiguous blocks
    problems = unfed_ranks(found, "data.dataset_path", "/corpus", "training records")
    if n < world:
        assert f"{n} training records over {world} data-parallel ranks" in problems[0].message
        with pytest.raises(
            RuntimeError, match=f"rank {world - 1} of {world} is handed none"
        ):  # not IndexError
            _text_rows(name, tok, world - 1, world, infinite=True)
        return
    assert problems == []
    for rank in range(world):
        rows = [
            row for row, _ in zip(_text_rows(name, tok, rank, world, infinite=True), range(2), strict=False)
        ]
        assert len(rows) == 2 and all(inputs["input"].shape == (8,) for inputs, _ in rows)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("n", SIZES)
def test_text_held_out_rows_per_rank_are_what_preflight_counts_then_padding(texts, n, world):
    make, made, tok = texts
    name, steps = make(n), 4
    encode = lambda sample: tok.encode(sample["text"], add_bos=True, add_eos=True)  # noqa: E731
    counted = data_shares.text(made[n], encode, seq_len=8, world=world, limit=steps).rows
    for rank in range(world):
        rows = _text_rows(name, tok, rank, world, infinite=False, pad_when_spent=True)
        labels = [lab for (_, lab), _ in zip(rows, range(steps), strict=False)]
        assert len(labels) == steps  # every rank runs the batches: none stops early, none loops
        real = [bool((lab != IGNORE_INDEX).any()) for lab in labels]
        assert real == [True] * counted[rank] + [False] * (steps - counted[rank])


def test_a_text_training_share_that_makes_no_token_stops_instead_of_looping_for_ever(texts):
    """Empty texts: the shipped tokenizer adds EOS and no BOS, so each gives no token after the
    shift; torchtitan's loader would re-loop over them for ever without a row."""
    make, _, tok = texts
    name = make(5, text=lambda i: "")
    with pytest.raises(RuntimeError, match="makes no token from its share"):
        next(iter(_text_rows(name, tok, 0, 1, infinite=True)))
