"""Pre-flight counts what each data-parallel rank is handed (records, and the rows they make), never
a proxy: a chat set that packs into fewer rows than ranks still gives every rank records and
passes; fewer records than ranks is refused with the numbers and the fix; the old crash case (60
held-out records on 64 ranks) passes with each rank's figures; text likewise."""

from __future__ import annotations

import json

from conftest import resolve

from qwen3_trainium.data import assets
from qwen3_trainium.parent.preflight.chat import check_chat
from qwen3_trainium.parent.preflight.heldout import check_heldout

RANKS_64 = "launcher.nproc_per_node=64"


def _chat_dir(tmp_path, n: int) -> str:
    lines = (assets.CHAT_DIR / "train.jsonl").read_text().splitlines()[:n]
    path = tmp_path / f"chat{n}"
    path.mkdir()
    (path / "train.jsonl").write_text("\n".join(lines) + "\n")
    return str(path)


def test_chat_records_not_rows_decide_at_64_ranks(tmp_path):
    """100 conversations pack into about 50 rows of 256, fewer than the 64 ranks: the old check
    refused them, yet each rank is handed one or two records and trains on them."""
    notes: list[str] = []
    run = resolve("data=chat", "smoke=on", f"data.dataset_path={_chat_dir(tmp_path, 100)}", RANKS_64)
    assert check_chat(run, notes) == []
    packed = next(n for n in notes if "packed into" in n)
    assert int(packed.split("packed into ")[1].split()[0]) < 64, packed
    line = "chat data: 100 records over 64 data-parallel ranks: 1 to 2 records, 1 to 2 rows per rank in the first epoch"
    assert line in notes, notes


def test_fewer_chat_records_than_ranks_are_refused_with_the_numbers_and_a_fix(tmp_path):
    run = resolve("data=chat", "smoke=on", f"data.dataset_path={_chat_dir(tmp_path, 40)}", RANKS_64)
    problems = check_chat(run, [])
    assert [p.key for p in problems] == ["data.dataset_path"]
    assert (
        "40 training records over 64 data-parallel ranks: ranks 40-63 would be handed none"
        in problems[0].message
    )
    assert problems[0].fix.startswith(
        "at least 64 training records (one per data-parallel rank), or at most 40 "
    )


def test_the_old_crash_case_60_held_out_chat_records_on_64_ranks_passes_with_each_ranks_figures():
    notes: list[str] = []
    assert check_chat(resolve("data=chat", "smoke=on", "eval=on", RANKS_64), notes) == []
    held = [n for n in notes if n.startswith("chat data, held out: 60 records over 64")]
    assert held == [
        "chat data, held out: 60 records over 64 data-parallel ranks: 0 to 1 records, 0 to 1 rows per rank"
    ]
    padded = [n for n in notes if "ranks 60-63 hold none and validate padding only" in n]
    assert len(padded) == 1 and "the held-out loss is over 60 rows, each scored once" in padded[0], notes


def _corpus(tmp_path, n: int) -> str:
    path = tmp_path / f"text{n}"
    path.mkdir()
    (path / "train.jsonl").write_text(
        "".join(json.dumps({"text": f"record number {i} " * 20}) + "\n" for i in range(n))
    )
    return str(path)


def test_text_training_blocks_are_counted_per_rank_and_fewer_records_than_ranks_refused(tmp_path):
    notes: list[str] = []
    run = resolve(
        "data=local", f"data.dataset_path={_corpus(tmp_path, 100)}", "training.seq_len=64", RANKS_64
    )
    assert check_heldout(run, notes) == []
    assert "text data: 100 records over 64 data-parallel ranks: 1 to 2 records per rank" in notes[0], notes
    run = resolve("data=local", f"data.dataset_path={_corpus(tmp_path, 40)}", "training.seq_len=64", RANKS_64)
    problems = check_heldout(run, [])
    assert [p.key for p in problems] == ["data.dataset_path"]
    assert (
        "40 training records over 64 data-parallel ranks: ranks 40-63 would be handed none"
        in problems[0].message
    )


def test_the_shipped_held_out_text_at_128_ranks_is_counted_per_rank():
    notes: list[str] = []
    run = resolve("eval=on", "smoke=on", "launcher.nproc_per_node=128")
    assert check_heldout(run, notes) == []
    assert "eval: held-out text: 1631 records over 128 data-parallel ranks: 12 to 13 records" in " ".join(
        notes
    ), notes


def test_the_per_rank_line_counts_in_words_that_agree_with_the_number():
    from qwen3_trainium.data.shares import Shares

    assert Shares(records=[9, 10], rows=[1, 1]).line("chat data") == (
        "chat data: 19 records over 2 data-parallel ranks: 9 to 10 records, 1 row per rank"
    )
    assert (
        Shares(records=[1], rows=[2]).line("x")
        == "x: 1 record over 1 data-parallel rank: 1 record, 2 rows per rank"
    )
