"""What each data-parallel rank is handed of a split, counted with the functions the ranks call:
pre-flight's figures and refusals come from here, never from a proxy (rows for records).

- Chat (``data/chat/stream.py``, ``shares``): rank ``r`` of ``w`` reads records ``r, r + w, ...``
  of each epoch's permutation (``stream.order``) and packs them itself; its rows are counted by
  running that rank's own ``RowStream``.
- Text (torchtitan's ``HuggingFaceTextDataset``): the rank's records are
  ``split_dataset_by_node(ds, rank, world)`` (``datasets.distributed``: a map-style dataset in
  contiguous blocks, ``len // world`` or one more; an iterable one by files, or every world-th
  example). Each record is ``encode(text, add_bos=True, add_eos=True)``, shifted within the
  document (one token fewer), and the tokens are cut into rows of ``seq_len``; a finite pass
  drops the last partial row (``__iter__``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Shares:
    """Per data-parallel rank: records handed, rows they make (at most ``limit`` counted)."""

    records: list[int]
    rows: list[int]
    limit: int | None = None
    tokens: list[int] | None = None  # text: tokens read (all of them when a rank makes no row)

    @property
    def world(self) -> int:
        return len(self.records)

    def without(self, per_rank: list[int], below: int = 1) -> list[int]:
        return [r for r, v in enumerate(per_rank) if v < below]

    def line(self, label: str, rows: bool = True) -> str:
        """``600 records over 64 data-parallel ranks: 9 to 10 records, 2 to 4 rows per rank``."""
        over = f"{self.world} data-parallel rank{'s' if self.world != 1 else ''}"
        head = f"{label}: {_count(sum(self.records), 'record')} over {over}: {_span(self.records, 'record')}"
        if not rows:
            return head + " per rank"
        capped = self.limit is not None and max(self.rows) >= self.limit
        return (
            head
            + f", {_span(self.rows, 'row')}"
            + (f" (counted up to {self.limit})" if capped else "")
            + " per rank"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _span(values: list[int], noun: str) -> str:
    low, high = min(values), max(values)
    return _count(low, noun) if low == high else f"{low} to {high} {noun}s"


def ranks(indices: list[int]) -> str:
    """``[60, 61, 62, 63, 70]`` -> ``ranks 60-63, 70``."""
    parts, start = [], None
    for i, r in enumerate(indices):
        if start is None:
            start = r
        if i + 1 == len(indices) or indices[i + 1] != r + 1:
            parts.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ("rank " if len(indices) == 1 else "ranks ") + ", ".join(parts)


def text_split(ds, rank: int, world: int):
    """Rank ``rank``'s part of ``ds``: the call torchtitan's ``HuggingFaceTextDataset`` makes.
    A map-style dataset of fewer records than ranks leaves the last ranks an empty contiguous
    block, and ``Dataset.shard`` raises IndexError selecting it (datasets 4.7): that is an empty
    share, and the rank's torchtitan dataset fails to build (``data/text.py``)."""
    from torchtitan.hf_datasets import text_datasets

    try:
        return text_datasets.split_dataset_by_node(ds, rank, world)
    except IndexError:
        return ds.select([])


def text(
    ds, encode: Callable[[dict], list[int]], *, seq_len: int, world: int, limit: int | None = None
) -> Shares:
    """Each rank's share of a map-style text dataset; rows of one finite pass, reading a rank's
    records only until ``limit`` rows (``encode(sample)``: the dataset's text processor, then
    torchtitan's tokenizer with BOS and EOS)."""
    records, rows, tokens = [], [], []
    for rank in range(world):
        part = text_split(ds, rank, world)
        count = 0
        for sample in part:
            count += max(len(encode(sample)) - 1, 0)
            if limit is not None and count // seq_len >= limit:
                break
        records.append(len(part))
        tokens.append(count)
        rows.append(count // seq_len if limit is None else min(count // seq_len, limit))
    return Shares(records, rows, limit, tokens)
