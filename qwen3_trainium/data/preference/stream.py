"""Rows of whole preference pairs: chat's row stream (``data/chat/stream.py``) with a pair as the
unit that is never split.

Everything but the unit is chat's: records in the same seeded per-epoch order (``order``: rank
``r`` of ``w`` reads ``perm[r::w]``), infinite training streams, held-out streams read once and
then padded (``pad_when_spent``), and an exact resume from ``state_dict``, refused when the data's
identity differs. A record gives at most one pair (``masks.encode``: a skipped or dropped record
gives none); its two documents go into the current row together, chosen first, if both fit,
else the row is padded and emitted and the pair starts the next one (``data.packing=false``: one
pair a row). Positions restart at 0 per document; padding is a document of its own, with no
labels.

Besides chat's ``input``, ``labels`` and ``positions``, a row carries the contract's two
per-row tensors (``data/preference/__init__.py``): ``segment`` (at each label position, ``2j``
for a chosen-completion target of the row's j-th pair, ``2j + 1`` for a rejected one, -1
elsewhere) and ``pairs`` (the j-th pair's record index in its split, -1 past the last;
``max_pairs(seq_len)`` long).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from qwen3_trainium.data import identity as ident
from qwen3_trainium.data.chat.masks import IGNORE_INDEX
from qwen3_trainium.data.chat.stream import SEED, Row, RowStream
from qwen3_trainium.data.preference import max_pairs
from qwen3_trainium.data.shares import Shares


@dataclass
class PairRow(Row):
    segment: list[int]  # per position: 2j / 2j + 1 on pair j's chosen / rejected targets, else -1
    pairs: list[int]  # the row's pairs' record indices, -1 after the last (max_pairs long)

    @property
    def n_pairs(self) -> int:
        return sum(p >= 0 for p in self.pairs)


def check_identity(saved: dict | None, ours: dict) -> None:
    """Chat's check (``identity.check``), and the fields it does not know (the mask rule): a
    state written by another objective's stream is refused too."""
    ident.check(saved, ours)
    # ident.check compares only the fields both sides hold: a chat SFT state has no mask rule
    extra = [k for k in ours if k not in ident.KEYS or k == "masks"]
    changed = [k for k in extra if saved and saved.get(k) != ours[k]]
    if changed:
        k = changed[0]
        raise ValueError(
            f"the checkpoint's data state was written by another stream ({k}: {saved.get(k)!r} then, "
            f"{ours[k]!r} now): resuming would read other rows. Fix: the objective it was written with, "
            "or a new run directory with checkpoint.initial_load_path=<its step folder>"
        )


class PairStream(RowStream):
    """Rows of ``seq_len`` from records ``0..n-1``; ``encode(i)`` gives record i's pair
    (``PairDocs``) or None. Chat's constructor: ``PairStream(n, encode, seq_len=..., pad_id=...,
    packing, rank, world, infinite, pad_when_spent, seed, identity)``."""

    def padding_row(self) -> PairRow:
        row = super().padding_row()
        return PairRow(**vars(row), segment=[-1] * self.seq_len, pairs=[-1] * max_pairs(self.seq_len))

    def _next_pair(self) -> bool:
        """Reads the next record of the share into ``pending``; False when the share is spent."""
        if self.cursor >= len(self._order):
            return False
        record = self._order[self.cursor]
        docs = self.encode(record)
        self.cursor += 1
        if docs is not None:
            self.pending = [(record, docs.chosen.inputs_labels(), docs.rejected.inputs_labels())]
        return True

    def _fill(self) -> PairRow | None:
        inputs: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        segment: list[int] = []
        pairs: list[int] = []
        while len(inputs) < self.seq_len:
            if not self.pending:
                if not self._next_pair():
                    break
                continue
            record, *sides = self.pending[0]
            size = sum(len(side_inputs) for side_inputs, _ in sides)
            assert size <= self.seq_len, "masks.fit keeps pairs within seq_len"
            if inputs and (not self.packing or len(inputs) + size > self.seq_len):
                break
            self.pending.pop(0)
            for s, (side_inputs, side_labels) in enumerate(sides):
                inputs += side_inputs
                labels += side_labels
                positions += range(len(side_inputs))
                segment += [2 * len(pairs) + s if t != IGNORE_INDEX else -1 for t in side_labels]
            pairs.append(record)
        if not inputs:
            return None
        real, pad = len(inputs), self.seq_len - len(inputs)
        return PairRow(
            inputs + [self.pad_id] * pad,
            labels + [IGNORE_INDEX] * pad,
            positions + list(range(pad)),
            2 * len(pairs),
            real,
            segment=segment + [-1] * pad,
            pairs=pairs + [-1] * (max_pairs(self.seq_len) - len(pairs)),
        )

    def state_dict(self) -> dict:
        pending = [[record, *(list(map(list, side)) for side in sides)] for record, *sides in self.pending]
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "pending": pending,
            "world": self.world,
            "identity": self.identity,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["world"] != self.world:
            saved = f"the checkpoint's data state is for {state['world']} data-parallel ranks"
            raise ValueError(f"{saved}, this run has {self.world}")
        check_identity(state.get("identity"), self.identity)
        longest = max((len(c[0]) + len(r[0]) for _, c, r in state["pending"]), default=0)
        if longest > self.seq_len:
            raise ValueError(
                f"the checkpoint's data state holds a pair of {longest} tokens, past training.seq_len "
                f"{self.seq_len}: it was written with a longer training.seq_len"
            )
        self._set_epoch(state["epoch"])
        self.cursor = state["cursor"]
        self.pending = [(record, tuple(c), tuple(r)) for record, c, r in state["pending"]]


def shares(
    n: int,
    docs: Callable,
    *,
    seq_len: int,
    packing: bool,
    world: int,
    seed: int = SEED,
    limit: int | None = None,
) -> Shares:
    """Each rank's epoch-0 share of ``n`` preference records, rows packed by its own stream."""
    records, rows = [], []
    for rank in range(world):
        stream = PairStream(
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
