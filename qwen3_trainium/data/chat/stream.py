"""Packed rows from conversations: the one sequence of training rows, for the ranks, the preview
and the dry run's counts alike.

Order: every epoch a permutation of the records (``random.Random(SEED + epoch)``, as torchtitan's
``ChatDataset`` reshuffles with ``seed=42 + epoch``); data-parallel rank ``r`` of ``w`` reads
positions ``r, r + w, ...`` of it. Samples (``masks.encode``) are packed greedily in that order:
a sample goes into the current row if it fits, else the row is padded and emitted and the sample
starts the next (``data.packing=false``: one sample per row). Positions restart at 0 for each
sample, so the attention masks torchtitan builds from them (``create_varlen_metadata_for_document``
/ the flex document mask) keep samples apart; padding is a document of its own, with no labels.

The state (``state_dict``) is the epoch, the next record and the samples read but not yet placed:
after any emitted row it determines every later row exactly, which is what resuming needs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from qwen3_trainium.data.chat.masks import IGNORE_INDEX, Counts, Doc

SEED = 42


@dataclass
class Row:
    input_ids: list[int]
    labels: list[int]
    positions: list[int]
    documents: int  # samples in the row (padding not counted)
    real: int  # positions that are not padding


def order(n: int, epoch: int, rank: int = 0, world: int = 1) -> list[int]:
    perm = list(range(n))
    random.Random(SEED + epoch).shuffle(perm)
    return perm[rank::world]


class RowStream:
    """Rows of ``seq_len`` from records ``0..n-1``; ``encode(i)`` gives record i's samples."""

    def __init__(self, n: int, encode: Callable[[int], list[Doc]], *, seq_len: int, pad_id: int,
                 packing: bool = True, rank: int = 0, world: int = 1, infinite: bool = True) -> None:  # fmt: skip
        self.n, self.encode, self.seq_len, self.pad_id = n, encode, seq_len, pad_id
        self.packing, self.rank, self.world, self.infinite = packing, rank, world, infinite
        self.epoch, self.cursor, self.pending = 0, 0, []
        self._order = order(n, 0, rank, world)
        self._empty_epochs = 0

    def _set_epoch(self, epoch: int) -> None:
        self.epoch, self.cursor = epoch, 0
        self._order = order(self.n, epoch, self.rank, self.world)

    def next_row(self) -> Row | None:
        """The next row, or None when a finite stream is spent."""
        while True:
            row = self._fill()
            if row is not None:
                self._empty_epochs = 0
                return row
            if not self.infinite:
                return None
            self._empty_epochs += 1
            if self._empty_epochs > 1:
                raise RuntimeError(
                    f"data-parallel rank {self.rank} of {self.world} has no trainable sample in a whole epoch"
                )
            self._set_epoch(self.epoch + 1)

    def _fill(self) -> Row | None:
        inputs: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        documents = 0
        while len(inputs) < self.seq_len:
            if not self.pending:
                if self.cursor >= len(self._order):
                    break
                record = self._order[self.cursor]
                self.pending = [d.inputs_labels() for d in self.encode(record)]
                self.cursor += 1
                continue
            doc_inputs, doc_labels = self.pending[0]
            if inputs and (not self.packing or len(inputs) + len(doc_inputs) > self.seq_len):
                break
            self.pending.pop(0)
            inputs += doc_inputs
            labels += doc_labels
            positions += range(len(doc_inputs))
            documents += 1
        if not inputs:
            return None
        real = len(inputs)
        pad = self.seq_len - real
        return Row(
            inputs + [self.pad_id] * pad,
            labels + [IGNORE_INDEX] * pad,
            positions + list(range(pad)),
            documents,
            real,
        )

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "pending": [list(map(list, p)) for p in self.pending],
                "world": self.world}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        if state["world"] != self.world:
            raise ValueError(
                f"the checkpoint's data state is for {state['world']} data-parallel ranks, this run has {self.world}"
            )
        self._set_epoch(state["epoch"])
        self.cursor = state["cursor"]
        self.pending = [tuple(p) for p in state["pending"]]


@dataclass
class Summary:
    counts: Counts
    rows: int
    real: int
    seq_len: int
    scanned: int  # records read (at most a cap)
    total: int  # records in the split

    @property
    def efficiency(self) -> float:
        return self.real / (self.rows * self.seq_len) if self.rows else 0.0

    def lines(self) -> list[str]:
        c = self.counts
        share = c.supervised / c.tokens if c.tokens else 0.0
        head = f"{self.total} records" + (
            f" (counted on the first {self.scanned})" if self.scanned < self.total else ""
        )
        out = [
            f"{head}: {c.samples} samples, {c.tokens} tokens, {c.supervised} supervised ({100 * share:.1f}%)",
            f"longer than seq_len: {c.dropped} dropped, {c.truncated} truncated",
            f"packed into {self.rows} rows of {self.seq_len}: {100 * self.efficiency:.1f}% of positions are tokens",
        ]
        if c.fallback_turns:
            out.append(
                f"{c.fallback_turns} assistant turns placed by difference (the template drops earlier reasoning)"
            )
        for reason, count in sorted(c.skipped.items()):
            out.append(f"skipped {count}: {reason}, first at {c.first_skip[reason]}")
        return out
