"""Packed rows from conversations: the one sequence of training rows, for the ranks, the preview
and the dry run's counts alike.

Order: every epoch a permutation of the records (``random.Random(seed + epoch)``; ``seed`` is
``debug.seed`` for training, 42 when unset, as torchtitan's ``ChatDataset`` reshuffles with
``seed=42 + epoch``, and always 42 for the held-out split, so a seed sweep scores the same rows);
data-parallel rank ``r`` of ``w`` reads positions ``r, r + w, ...`` of it (``order``: the one
function that says what a rank is handed, called by the ranks and by pre-flight). Samples
(``masks.encode``) are packed greedily in that order: a sample goes into the current row if it
fits, else the row is padded and emitted and the sample starts the next (``data.packing=false``:
one sample per row). Positions restart at 0 for each sample, so the attention masks torchtitan
builds from them (``create_varlen_metadata_for_document`` / the flex document mask) keep samples
apart; padding is a document of its own, with no labels.

Training streams loop (a new permutation each epoch). A rank whose share of an epoch gives no
sample (every record dropped or skipped) moves on to the next epoch; only a rank handed no record
at all, or one that misses every trainable record for ``EMPTY_EPOCHS_PER_RANK x world`` epochs
running (odds below e^-20 while one record of the split trains), stops with an error.
Validation streams (``pad_when_spent``) read the rank's share once, then give rows of padding
without labels: every rank runs the Validator's ``eval.steps`` batches (it has no cross-rank
agreement on when data ends, so a rank that stopped early would leave the others waiting in
collectives), each held-out row is scored once, and padding adds nothing to the loss or to the
count of supervised tokens it is divided by.

The state (``state_dict``) is the epoch, the next record and the samples read but not yet placed:
after any emitted row it determines every later row exactly, which is what resuming needs. It
carries the stream's ``identity`` (``data/identity.py``): a resume whose records, template,
masks, ``seq_len``, packing or seed differ is refused rather than read as other rows.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from qwen3_trainium.data import identity as ident
from qwen3_trainium.data.chat.masks import IGNORE_INDEX, Counts, Doc
from qwen3_trainium.data.shares import Shares

SEED = 42  # the order's seed when debug.seed is unset (torchtitan ChatDataset's)
# A rank's share of an epoch is floor(n/w) >= n/(2w) of the n records (n >= w), so one trainable
# record escapes an epoch's share with odds at most 1 - 1/(2w), and 40 w epochs running with odds
# below (1 - 1/(2w)) ** (40 w) < e^-20.
EMPTY_EPOCHS_PER_RANK = 40


@dataclass
class Row:
    input_ids: list[int]
    labels: list[int]
    positions: list[int]
    documents: int  # samples in the row (padding not counted)
    real: int  # positions that are not padding


def order(n: int, epoch: int, rank: int = 0, world: int = 1, seed: int = SEED) -> list[int]:
    """The records data-parallel rank ``rank`` of ``world`` reads in ``epoch``, in reading order."""
    perm = list(range(n))
    random.Random(seed + epoch).shuffle(perm)
    return perm[rank::world]


class RowStream:
    """Rows of ``seq_len`` from records ``0..n-1``; ``encode(i)`` gives record i's samples."""

    def __init__(
        self,
        n: int,
        encode: Callable[[int], list[Doc]],
        *,
        seq_len: int,
        pad_id: int,
        packing: bool = True,
        rank: int = 0,
        world: int = 1,
        infinite: bool = True,
        pad_when_spent: bool = False,
        seed: int = SEED,
        identity: dict | None = None,
    ) -> None:
        self.n, self.encode, self.seq_len, self.pad_id = n, encode, seq_len, pad_id
        self.packing, self.rank, self.world, self.infinite = packing, rank, world, infinite
        self.pad_when_spent, self.seed, self.identity = pad_when_spent, seed, identity or {}
        self.epoch, self.cursor, self.pending = 0, 0, []
        self._order = order(n, 0, rank, world, seed)
        self._empty_epochs = 0

    def _set_epoch(self, epoch: int) -> None:
        self.epoch, self.cursor = epoch, 0
        self._order = order(self.n, epoch, self.rank, self.world, self.seed)

    def next_row(self) -> Row | None:
        """The next row; when the share is spent: padding (``pad_when_spent``), the next epoch
        (``infinite``), else None."""
        while True:
            row = self._fill()
            if row is not None:
                self._empty_epochs = 0
                return row
            if self.pad_when_spent:
                return self.padding_row()
            if not self.infinite:
                return None
            self._starved()
            self._set_epoch(self.epoch + 1)

    def padding_row(self) -> Row:
        """A row of padding: no labels, so it adds nothing to a loss summed over supervised tokens."""
        return Row(
            [self.pad_id] * self.seq_len, [IGNORE_INDEX] * self.seq_len, list(range(self.seq_len)), 0, 0
        )

    def _starved(self) -> None:
        """An epoch of this rank's share gave no row: fine now and then (its records were all
        dropped or skipped), never for a rank handed nothing."""
        self._empty_epochs += 1
        where = f"data-parallel rank {self.rank} of {self.world}"
        if not self._order:
            raise RuntimeError(
                f"{where} is handed none of the {self.n} records (rank r reads records r, r + {self.world}, ...); "
                "pre-flight refuses this: check the run with dry_run=true"
            )
        if self._empty_epochs > EMPTY_EPOCHS_PER_RANK * self.world:
            raise RuntimeError(f"{where} found no trainable sample in {self._empty_epochs} epochs running")

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
            assert len(doc_inputs) <= self.seq_len, "masks.fit keeps samples within seq_len"
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
        pending = [list(map(list, p)) for p in self.pending]
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "pending": pending,
            "world": self.world,
            "identity": self.identity,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["world"] != self.world:
            raise ValueError(
                f"the checkpoint's data state is for {state['world']} data-parallel ranks, this run has {self.world}"
            )
        ident.check(state.get("identity"), self.identity)
        longest = max((len(inputs) for inputs, _ in state["pending"]), default=0)
        if longest > self.seq_len:  # a state from a longer seq_len: its samples would overflow a row
            raise ValueError(
                f"the checkpoint's data state holds a sample of {longest} tokens, past training.seq_len "
                f"{self.seq_len}: it was written with a longer training.seq_len"
            )
        self._set_epoch(state["epoch"])
        self.cursor = state["cursor"]
        self.pending = [tuple(p) for p in state["pending"]]


def shares(
    n: int, docs: Callable, *, seq_len: int, packing: bool, world: int, seed: int, limit: int | None = None
) -> Shares:
    """Each rank's epoch-0 share of ``n`` chat records, rows packed by its own ``RowStream``
    (``docs(i)``: record i's samples; memoise it, every rank asks for its own records only)."""
    records, rows = [], []
    for rank in range(world):
        stream = RowStream(
            n,
            docs,
            seq_len=seq_len,
            pad_id=0,
            packing=packing,
            rank=rank,
            world=world,
            infinite=False,
            seed=seed,
        )
        count = 0
        while (limit is None or count < limit) and stream.next_row() is not None:
            count += 1
        records.append(len(stream._order))
        rows.append(count)
    return Shares(records, rows, limit)


@dataclass
class Summary:
    counts: Counts
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
        share = c.supervised / c.tokens if c.tokens else 0.0
        head = f"{self.total} records" + (
            f" (counted on the first {self.scanned})" if self.scanned < self.total else ""
        )
        out = [
            f"{head}: {c.samples} samples, {c.tokens} tokens, {c.supervised} supervised ({100 * share:.1f}%)",
            f"longer than seq_len: {c.dropped} dropped, {c.truncated} truncated",
            f"packed into {self.rows} rows of {self.seq_len}: {100 * self.efficiency:.1f}% of positions are tokens",
        ]
        if c.dropped or c.truncated:
            lost = c.tokens_dropped + c.tokens_cut
            out.append(
                f"longer than seq_len: {c.tokens_dropped} tokens dropped, {c.tokens_cut} cut: {lost} of"
                f" {c.tokens + lost} tokens ({100 * lost / (c.tokens + lost):.1f}%) left out of the rows"
            )
        if c.truncated:
            ends = "; ".join(f"{n} {why}" for why, n in sorted(c.cut_at_end.items()))
            out.append(
                f"truncated: {c.cut_in_reasoning} inside the reasoning, the final answer kept"
                + (f"; at the end, the answer lost: {ends}" if ends else "")
            )
        if c.fallback_turns:
            out.append(
                f"{c.fallback_turns} assistant turns placed by difference (the template drops earlier reasoning)"
            )
        for reason, count in sorted(c.skipped.items()):
            out.append(f"skipped {count}: {reason}, first at {c.first_skip[reason]}")
        return out
