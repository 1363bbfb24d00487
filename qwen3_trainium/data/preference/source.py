"""A run's preference data: which records train and which are held out, the masker, the row
stream, the dry run's counts and the preview. Used by pre-flight (parent) and the ranks alike.

Files, splits and held-out records are chat's (``data/chat/source.py``): ``data.dataset_path``
(a file, a directory split by file names, or a cached Hub dataset); held out for ``eval=on``,
first that applies: ``data.validation_path``, the dataset's own validation files, else every
record the fraction rule picks (``heldout.heldout``), which training then skips. A pair's index
in its split's record list (``records(run, split)``) is its ``PAIR_KEY`` in the rows and its key
in the reference table.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

from qwen3_trainium.data import identity as ident
from qwen3_trainium.data.chat import records as chat_records
from qwen3_trainium.data.chat import source as chat_source
from qwen3_trainium.data.chat.template import ChatTokenizer
from qwen3_trainium.data.preference import records as rec
from qwen3_trainium.data.preference.masks import MASK_RULE, PairCounts, PairMasker, encode
from qwen3_trainium.data.preference.stream import PairStream, shares
from qwen3_trainium.data.shares import Shares

SCAN_CAP = chat_source.SCAN_CAP  # records the dry run's counts read at most
seed = chat_source.seed  # debug.seed for training, 42 for the held-out split


def tokenizer(run) -> ChatTokenizer:
    return chat_source.tokenizer(run)


def masker(run, tok: ChatTokenizer | None = None) -> PairMasker:
    return PairMasker(tok or tokenizer(run), kwargs=dict(run.data.chat_template_kwargs or {}))


@functools.lru_cache(maxsize=4)
def _load(files: tuple[str, ...]) -> list[rec.Pair]:
    return rec.load(list(files))


def records(run, split: str = "train") -> list[rec.Pair]:
    """The pairs of a split (the first bad record raises a RecordError naming its file:line)."""
    from qwen3_trainium.data.heldout import heldout

    train, val, fraction = chat_source._split_files(run)  # chat's rule for which files hold what
    pairs = _load(tuple(train if split == "train" else val))
    if not fraction:
        return list(pairs)
    f = run.data.validation_fraction
    return [p for i, p in enumerate(pairs) if heldout(i, f) == (split != "train")]


def identity(run) -> dict:
    """What decides the training rows (``data/identity.py``): saved with each checkpoint. Chat's
    fields less its SFT masks' settings, plus the preference mask rule (``masks.MASK_RULE``)."""
    train, _, fraction = chat_source._split_files(run)
    held = f"every record the fraction {run.data.validation_fraction:g} picks" if fraction else "none"
    return {
        "records": ident.files(train, chat_records.resolve(run.data.dataset_path)),
        "held_out": held,
        "tokenizer": ident.tokenizer(run.data.hf_assets_path),
        "template": ident.text(tokenizer(run).template),
        "chat_template_kwargs": dict(run.data.chat_template_kwargs or {}),
        "overflow": run.data.overflow.value,
        "seq_len": run.training.seq_len,
        "packing": run.data.packing,
        "seed": seed(run),
        "masks": MASK_RULE,
    }


def _encoder(run, pairs: list, counts: PairCounts):
    """Record i's pair (or None), each record encoded once (the counts count it once)."""
    m = masker(run)
    seq_len, overflow = run.training.seq_len, run.data.overflow.value
    return functools.cache(lambda i: encode(m, pairs[i], seq_len, overflow, counts))


def stream(run, split: str = "train", *, rank: int = 0, world: int = 1, infinite: bool = True) -> PairStream:
    """Rank ``rank`` of ``world``'s rows. The held-out split, asked to be infinite (torchtitan's
    Validator does whenever ``eval.steps`` is set), reads its share once and then pads."""
    pairs = records(run, split)
    held_out = split != "train"
    m, counts = masker(run), PairCounts()
    seq_len, overflow = run.training.seq_len, run.data.overflow.value
    return PairStream(
        len(pairs),
        lambda i: encode(m, pairs[i], seq_len, overflow, counts),  # each epoch anew, as chat's: no cache
        seq_len=seq_len,
        pad_id=m.tok.pad_id,
        packing=run.data.packing,
        rank=rank,
        world=world,
        infinite=infinite and not held_out,
        pad_when_spent=infinite and held_out,
        seed=seed(run, split),
        identity=None if held_out else identity(run),
    )


@dataclass
class Summary:
    counts: PairCounts
    rows: int
    real: int
    seq_len: int
    scanned: int  # records read (at most a cap)
    total: int  # records in the split
    shares: Shares | None = None  # what each data-parallel rank is handed

    @property
    def efficiency(self) -> float:
        return self.real / (self.rows * self.seq_len) if self.rows else 0.0

    def lines(self) -> list[str]:
        c = self.counts
        share = c.completion / c.tokens if c.tokens else 0.0
        head = f"{self.total} records" + (
            f" (counted on the first {self.scanned})" if self.scanned < self.total else ""
        )
        per_row = c.pairs / self.rows if self.rows else 0.0
        out = [
            f"{head}: {c.pairs} pairs, {c.tokens} tokens, "
            f"{c.completion} completion tokens ({100 * share:.1f}%)",
            f"pairs longer than seq_len: {c.dropped} dropped, {c.truncated} truncated (each side's end cut)"
            + (f"; first dropped at {c.first_dropped}" if c.dropped else ""),
            f"packed into {self.rows} rows of {self.seq_len}, {per_row:.1f} pairs a row: "
            f"{100 * self.efficiency:.1f}% of positions are tokens",
        ]
        if c.dropped or c.truncated:
            out.append(f"longer than seq_len: {c.tokens_dropped} tokens dropped, {c.tokens_cut} cut")
        for reason, count in sorted(c.skipped.items()):
            out.append(f"skipped {count}: {reason}, first at {c.first_skip[reason]}")
        return out


def summarise(
    run, split: str = "train", cap: int = SCAN_CAP, world: int = 1, limit: int | None = None
) -> Summary:
    """One pass over (at most ``cap`` of) a split's records, packed as rank 0 of one would, and
    what each of ``world`` data-parallel ranks is handed (rows up to ``limit`` a rank; without a
    limit the whole share, which needs every record scanned: else one row a rank)."""
    pairs = records(run, split)
    scanned = min(len(pairs), cap)
    counts = PairCounts()
    docs = _encoder(run, pairs, counts)
    for i in range(scanned):
        docs(i)
    counted = copy.deepcopy(counts)  # the scan's, before the shares read more
    order_seed, seq_len, packing = seed(run, split), run.training.seq_len, run.data.packing
    one = PairStream(
        scanned, docs, seq_len=seq_len, pad_id=0, packing=packing, infinite=False, seed=order_seed
    )
    rows, real = 0, 0
    while (row := one.next_row()) is not None:
        rows += 1
        real += row.real
    if limit is None and scanned < len(pairs):
        limit = 1
    per_rank = shares(
        len(pairs), docs, seq_len=seq_len, packing=packing, world=world, seed=order_seed, limit=limit
    )
    return Summary(counted, rows, real, seq_len, scanned, len(pairs), per_rank)


def preview_rows(run, n: int, world: int = 1) -> list:
    """The first ``n`` rows data-parallel rank 0 trains on (of ``world``)."""
    s = stream(run, rank=0, world=world, infinite=True)
    return [s.next_row() for _ in range(n)]


def _documents(row) -> list[tuple[int, int]]:
    """(start, end) of each document of the row (padding left out): chosen_0, rejected_0, ..."""
    starts = [i for i in range(row.real) if row.positions[i] == 0]
    return list(zip(starts, starts[1:] + [row.real], strict=True))


def _pair_md(tok: ChatTokenizer, row, j: int, pair: rec.Pair, spans: list[tuple[int, int]]) -> list[str]:
    from qwen3_trainium.data.chat.stream import Row

    out = [f"### Pair {j + 1}: record {row.pairs[j]} ({pair.where})", ""]
    for side, (a, b) in zip(rec.SIDES, spans, strict=True):
        doc = Row(row.input_ids[a:b], row.labels[a:b], row.positions[a:b], 1, b - a)
        out += [f"{side}:", "```text", chat_source._marked(tok, doc), "```", ""]  # chat's ⟦ ⟧ marking
    return out


def write_preview(run, run_dir: str, n: int, world: int = 1) -> tuple[str, str]:
    """``data_preview.md`` (each row's pairs: the prompt, then the chosen and the rejected
    completion inside ⟦ ⟧) and ``data_preview.jsonl`` (``input_ids``, ``labels`` with -100,
    ``positions``, ``segment``, ``pairs``) in ``run_dir``."""
    import json
    import os

    tok, pairs = tokenizer(run), records(run)
    md = [
        f"# Data preview: the first {n} rows data-parallel rank 0 trains on",
        "",
        f"seq_len {run.training.seq_len}, packing {'on' if run.data.packing else 'off'}, overflow "
        f"{run.data.overflow.value}, template {tok.template_source}. Each pair is its chosen document, "
        "then its rejected one (prompt and response, as the template renders them); the completion tokens "
        "DPO scores (TRL 1.16.0's: to the end of the render) are inside ⟦ ⟧; padding is not shown.",
        "",
    ]
    os.makedirs(run_dir, exist_ok=True)
    md_path, jsonl_path = (
        os.path.join(run_dir, chat_source.PREVIEW_MD),
        os.path.join(run_dir, chat_source.PREVIEW_JSONL),
    )
    with open(jsonl_path, "w") as f:
        for i, row in enumerate(preview_rows(run, n, world)):
            keys = ("input_ids", "labels", "positions", "segment", "pairs")
            f.write(json.dumps({k: getattr(row, k) for k in keys}) + "\n")
            completion = sum(label >= 0 for label in row.labels)
            md += [
                f"## Row {i + 1}: {row.n_pairs} pairs, {row.real} of {run.training.seq_len} positions are "
                f"tokens, {completion} completion tokens",
                "",
            ]
            spans = _documents(row)
            for j in range(row.n_pairs):
                md += _pair_md(tok, row, j, pairs[row.pairs[j]], spans[2 * j : 2 * j + 2])
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    return md_path, jsonl_path
