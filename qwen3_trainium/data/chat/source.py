"""A run's chat data: which records train and which are held out, the masker, the row stream,
the dry run's counts and the preview. Used by pre-flight (parent) and the ranks alike.

Held out for ``eval=on``, first that applies (as for plain text, ``data/heldout.py``):
``data.validation_path``; the dataset's own validation files (by name); else every record the
fraction rule picks (``heldout.heldout``), which training then skips.
"""

from __future__ import annotations

import copy
import functools
import json
import os

from qwen3_trainium.data import identity as ident
from qwen3_trainium.data.chat import records as rec
from qwen3_trainium.data.chat.masks import Counts, Masker, encode
from qwen3_trainium.data.chat.stream import SEED, Row, RowStream, Summary, shares
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


def seed(run, split: str = "train") -> int:
    """The order's seed: ``debug.seed`` for training (a seed sweep varies the data order too);
    always ``SEED`` for the held-out split, so that every run of a sweep scores the same rows."""
    if split != "train" or run.debug.seed is None:
        return SEED
    return run.debug.seed


def identity(run) -> dict:
    """What decides the training rows (``data/identity.py``): saved with each checkpoint."""
    train, _, fraction = _split_files(run)
    tok = tokenizer(run)
    held = f"every record the fraction {run.data.validation_fraction:g} picks" if fraction else "none"
    return {
        "records": ident.files(train, rec.resolve(run.data.dataset_path)),
        "held_out": held,
        "tokenizer": ident.tokenizer(run.data.hf_assets_path),
        "template": ident.text(tok.template),
        "chat_template_kwargs": dict(run.data.chat_template_kwargs or {}),
        "loss_on": run.data.loss_on.value,
        "history_thinking": run.data.history_thinking.value,
        "overflow": run.data.overflow.value,
        "seq_len": run.training.seq_len,
        "packing": run.data.packing,
        "seed": seed(run),
    }


def _encoder(run, convs: list, counts: Counts):
    """Record i's samples, each record encoded once (the counts count it once)."""
    m = masker(run)
    seq_len, overflow = run.training.seq_len, run.data.overflow.value
    return functools.cache(lambda i: encode(m, convs[i], seq_len, overflow, counts))


def stream(run, split: str = "train", *, rank: int = 0, world: int = 1, infinite: bool = True) -> RowStream:
    """Rank ``rank`` of ``world``'s rows. The held-out split, asked to be infinite (torchtitan's
    Validator does whenever ``eval.steps`` is set), reads its share once and then pads
    (``RowStream``: every rank runs the same batches, each row scored once)."""
    convs = conversations(run, split)
    tok = tokenizer(run)
    m = masker(run, tok)
    seq_len, overflow = run.training.seq_len, run.data.overflow.value
    counts = Counts()
    held_out = split != "train"
    return RowStream(
        len(convs),
        lambda i: encode(m, convs[i], seq_len, overflow, counts),
        seq_len=seq_len,
        pad_id=tok.pad_id,
        packing=run.data.packing,
        rank=rank,
        world=world,
        infinite=infinite and not held_out,
        pad_when_spent=infinite and held_out,
        seed=seed(run, split),
        identity=None if held_out else identity(run),
    )


def summarise(
    run, split: str = "train", cap: int = SCAN_CAP, world: int = 1, limit: int | None = None
) -> Summary:
    """One pass over (at most ``cap`` of) a split's records, packed as rank 0 of one would, and
    what each of ``world`` data-parallel ranks is handed (``stream.shares``: every record's count,
    rows up to ``limit`` a rank; without a limit the whole share, which needs every record
    scanned: else one row a rank, enough to prove none is left without)."""
    convs = conversations(run, split)
    scanned = min(len(convs), cap)
    counts = Counts()
    docs = _encoder(run, convs, counts)
    for i in range(scanned):
        docs(i)
    counted = copy.deepcopy(counts)  # the scan's, before the shares read more
    order_seed, seq_len, packing = seed(run, split), run.training.seq_len, run.data.packing
    one = RowStream(
        scanned, docs, seq_len=seq_len, pad_id=0, packing=packing, infinite=False, seed=order_seed
    )
    rows, real = 0, 0
    while (row := one.next_row()) is not None:
        rows += 1
        real += row.real
    if limit is None and scanned < len(convs):
        limit = 1
    per_rank = shares(
        len(convs), docs, seq_len=seq_len, packing=packing, world=world, seed=order_seed, limit=limit
    )
    return Summary(counted, rows, real, seq_len, scanned, len(convs), per_rank)


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
            plural = "s" if row.documents != 1 else ""
            md.append(
                f"## Row {i + 1}: {row.documents} sample{plural}, "
                f"{row.real} of {run.training.seq_len} positions are tokens, {supervised} supervised"
            )
            md.append("")
            md += ["```text", _marked(tok, row), "```", ""]
    with open(os.path.join(run_dir, PREVIEW_MD), "w") as f:
        f.write("\n".join(md))
    return os.path.join(run_dir, PREVIEW_MD), os.path.join(run_dir, PREVIEW_JSONL)


PREVIEW_HEAD = PREVIEW_TAIL = 400  # tokens of a long row shown at each end (the rest is counted)


def _marked(tok: ChatTokenizer, row: Row) -> str:
    """The row's text, each run of supervised tokens inside ⟦ ⟧. A token is supervised when the
    label that predicts it is not -100; a sample's first token never is (nothing predicts it).
    A row longer than ``PREVIEW_HEAD + PREVIEW_TAIL`` tokens shows its first and last tokens only,
    and says what is left out between them (tokens, supervised ones, samples starting there), so
    that a 32k row is a few kilobytes of markdown, not hundreds."""
    pieces: list[tuple[int, str, bool]] = []  # (token index, text, supervised)

    def text(token_id: int) -> str:
        return tok.tokenizer.decode([token_id], skip_special_tokens=False)

    for i in range(row.real):
        if row.positions[i] == 0:
            pieces.append((i, "⟂" if i else "", False))
            pieces.append((i, text(row.input_ids[i]), False))
        if row.labels[i] >= 0:
            pieces.append((i + 1, text(row.labels[i]), True))
        elif i + 1 < row.real and row.positions[i + 1] != 0:
            pieces.append((i + 1, text(row.input_ids[i + 1]), False))
    return _joined(_elided(pieces, row))


def _elided(pieces: list[tuple[int, str, bool]], row: Row) -> list[tuple[int, str, bool | None]]:
    """``pieces`` less the middle of a long row, replaced by one note (supervised: None)."""
    if row.real <= PREVIEW_HEAD + PREVIEW_TAIL:
        return pieces
    lo, hi = PREVIEW_HEAD, row.real - PREVIEW_TAIL
    hidden = range(lo, hi)
    supervised = sum(row.labels[i - 1] >= 0 for i in hidden)
    starts = sum(row.positions[i] == 0 for i in hidden)
    note = f" ⟪… {len(hidden)} tokens not shown: {supervised} supervised"
    note += f", {starts} sample{'s' if starts != 1 else ''} starting among them …⟫ " if starts else " …⟫ "
    head = [p for p in pieces if p[0] < lo]
    return head + [(lo, note, None)] + [p for p in pieces if p[0] >= hi]


def _joined(pieces: list[tuple[int, str, bool | None]]) -> str:
    out, inside = [], False
    for _, piece, supervised in pieces:
        if supervised is None:  # a note: outside the brackets, which reopen after it as needed
            out.append(("⟧" if inside else "") + piece)
            inside = False
            continue
        if supervised != inside:
            out.append("⟦" if supervised else "⟧")
            inside = supervised
        out.append(piece)
    return "".join(out) + ("⟧" if inside else "")
