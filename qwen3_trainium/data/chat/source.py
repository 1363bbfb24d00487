"""A run's chat data: which records train and which are held out, the masker, the row stream,
the dry run's counts and the preview. Used by pre-flight (parent) and the ranks alike.

Held out for ``eval=on``, first that applies (as for plain text, ``data/heldout.py``):
``data.validation_path``; the dataset's own validation files (by name); else every record the
fraction rule picks (``heldout.heldout``), which training then skips.
"""

from __future__ import annotations

import functools
import json
import os

from qwen3_trainium.data.chat import records as rec
from qwen3_trainium.data.chat.masks import Counts, Masker, encode
from qwen3_trainium.data.chat.stream import Row, RowStream, Summary
from qwen3_trainium.data.chat.template import ChatTokenizer

PREVIEW_MD = "data_preview.md"
PREVIEW_JSONL = "data_preview.jsonl"
SCAN_CAP = 2000  # records the dry run's counts read at most


def is_chat(run) -> bool:
    return run.data.format.value != "text"


def tokenizer(run) -> ChatTokenizer:
    return ChatTokenizer.load(run.data.hf_assets_path, run.data.chat_template)


def masker(run, tok: ChatTokenizer | None = None) -> Masker:
    return Masker(
        tok or tokenizer(run),
        loss_on=run.data.loss_on.value,
        history_thinking=run.data.history_thinking.value,
        kwargs=dict(run.data.chat_template_kwargs or {}),
    )


def _split_files(run) -> tuple[list[str], list[str], bool]:
    """(train files, held-out files, whether the held-out records are a fraction of train's)."""
    root = rec.resolve(run.data.dataset_path)
    if root is None:
        raise FileNotFoundError(run.data.dataset_path)
    splits = rec.split_files(root)
    if not run.eval.enable:
        return splits["train"], [], False
    if run.data.validation_path:
        return splits["train"], rec.data_files(run.data.validation_path), False
    if splits["validation"]:
        return splits["train"], splits["validation"], False
    return splits["train"], splits["train"], True


@functools.lru_cache(maxsize=4)
def _load(files: tuple[str, ...], fmt: str) -> list:
    return rec.load(list(files), fmt)


def conversations(run, split: str = "train") -> list:
    """The records of a split as Conversations (the first bad record raises a RecordError)."""
    from qwen3_trainium.data.heldout import heldout

    train, val, fraction = _split_files(run)
    fmt = run.data.format.value
    convs = _load(tuple(train if split == "train" else val), fmt)
    if not fraction:
        return list(convs)
    f = run.data.validation_fraction
    return [c for i, c in enumerate(convs) if heldout(i, f) == (split != "train")]


def stream(run, split: str = "train", *, rank: int = 0, world: int = 1, infinite: bool = True,
           counts: Counts | None = None) -> RowStream:  # fmt: skip
    convs = conversations(run, split)
    tok = tokenizer(run)
    m = masker(run, tok)
    seq_len, overflow = run.training.seq_len, run.data.overflow.value
    counts = counts if counts is not None else Counts()
    return RowStream(
        len(convs),
        lambda i: encode(m, convs[i], seq_len, overflow, counts),
        seq_len=seq_len,
        pad_id=tok.pad_id,
        packing=run.data.packing,
        rank=rank,
        world=world,
        infinite=infinite,
    )


def summarise(run, split: str = "train", cap: int = SCAN_CAP) -> Summary:
    """One pass over (at most ``cap`` of) a split's records, packed as rank 0 of one would."""
    convs = conversations(run, split)
    scanned = convs[:cap]
    tok = tokenizer(run)
    m = masker(run, tok)
    counts = Counts()
    docs = [encode(m, c, run.training.seq_len, run.data.overflow.value, counts) for c in scanned]
    rows_stream = RowStream(len(scanned), lambda i: docs[i], seq_len=run.training.seq_len, pad_id=tok.pad_id,
                            packing=run.data.packing, infinite=False)  # fmt: skip
    rows, real = 0, 0
    while (row := rows_stream.next_row()) is not None:
        rows += 1
        real += row.real
    return Summary(counts, rows, real, run.training.seq_len, len(scanned), len(convs))


def preview_rows(run, n: int, world: int = 1) -> list[Row]:
    """The first ``n`` rows data-parallel rank 0 trains on (of ``world``)."""
    s = stream(run, rank=0, world=world, infinite=True)
    return [s.next_row() for _ in range(n)]


def write_preview(run, run_dir: str, n: int, world: int = 1) -> tuple[str, str]:
    """``data_preview.md`` (each row's text, supervised tokens in bold brackets) and
    ``data_preview.jsonl`` (``input_ids``, ``labels`` with -100, ``positions``) in ``run_dir``."""
    tok = tokenizer(run)
    rows = preview_rows(run, n, world)
    md = [
        f"# Data preview: the first {n} rows data-parallel rank 0 trains on",
        "",
        f"seq_len {run.training.seq_len}, packing {'on' if run.data.packing else 'off'}, loss_on "
        f"{run.data.loss_on.value}, history_thinking {run.data.history_thinking.value}, template "
        f"{tok.template_source}. Supervised tokens (those the loss trains the model to produce) are shown "
        "inside ⟦ ⟧; ⟂ marks where a new sample starts (positions restart at 0); padding is not shown.",
        "",
    ]
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, PREVIEW_JSONL), "w") as f:
        for i, row in enumerate(rows):
            f.write(
                json.dumps({"input_ids": row.input_ids, "labels": row.labels, "positions": row.positions})
                + "\n"
            )
            supervised = sum(label >= 0 for label in row.labels)
            md += [f"## Row {i + 1}: {row.documents} sample{'s' if row.documents != 1 else ''}, "
                   f"{row.real} of {run.training.seq_len} positions are tokens, {supervised} supervised", ""]  # fmt: skip
            md += ["```text", _marked(tok, row), "```", ""]
    with open(os.path.join(run_dir, PREVIEW_MD), "w") as f:
        f.write("\n".join(md))
    return os.path.join(run_dir, PREVIEW_MD), os.path.join(run_dir, PREVIEW_JSONL)


def _marked(tok: ChatTokenizer, row: Row) -> str:
    """The row's text, each run of supervised tokens inside ⟦ ⟧. A token is supervised when the
    label that predicts it is not -100; a sample's first token never is (nothing predicts it)."""
    pieces: list[tuple[str, bool]] = []

    def text(token_id: int) -> str:
        return tok.tokenizer.decode([token_id], skip_special_tokens=False)

    for i in range(row.real):
        if row.positions[i] == 0:
            pieces.append(("⟂" if i else "", False))
            pieces.append((text(row.input_ids[i]), False))
        if row.labels[i] >= 0:
            pieces.append((text(row.labels[i]), True))
        elif i + 1 < row.real and row.positions[i + 1] != 0:
            pieces.append((text(row.input_ids[i + 1]), False))
    out, inside = [], False
    for piece, supervised in pieces:
        if supervised != inside:
            out.append("⟦" if supervised else "⟧")
            inside = supervised
        out.append(piece)
    return "".join(out) + ("⟧" if inside else "")
