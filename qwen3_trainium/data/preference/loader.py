"""torchtitan's dataloader seam for preference pairs (rank side), as ``data/chat/loader.py`` is
for chat: ``PreferenceRows`` is the dataset, ``PreferenceDataLoader`` the
``ParallelAwareDataloader`` torchtitan builds from ``Trainer.Config.dataloader`` and
``Validator.Config.dataloader``, and ``pair_rows`` the one finite pass over a rank's share of a
split's records that the reference pre-pass (``rank/dpo_reference.py``) scores.

A row is the contract's (``data/preference/__init__.py``): ``({"input", "positions",
MASK_KEY (training rows only), SEGMENT_KEY, PAIR_KEY}, labels)``; the trainer takes the extra keys
out of the batch before the model (``rank/dpo.py``, ``rank/moe_balance.py``). The data state
(the stream's ``state_dict``, with the data's identity) goes into each checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

from qwen3_trainium.data.chat.loader import MASK_KEY, ChatDataLoader
from qwen3_trainium.data.preference import PAIR_KEY, SEGMENT_KEY, source
from qwen3_trainium.data.preference.stream import PairRow, PairStream


def tensors(row: PairRow, masked: bool) -> tuple[dict, torch.Tensor]:
    """A row as the loader yields it (before batching): ``(input_dict, labels)``, int64."""
    batch = {
        "input": torch.tensor(row.input_ids),
        "positions": torch.tensor(row.positions),
        SEGMENT_KEY: torch.tensor(row.segment, dtype=torch.int64),
        PAIR_KEY: torch.tensor(row.pairs, dtype=torch.int64),
    }
    if masked:  # the MoE balance mask: every position that is not padding (chat's rule)
        batch[MASK_KEY] = torch.arange(len(row.input_ids)) < row.real
    return batch, torch.tensor(row.labels)


class PreferenceRows(IterableDataset, Stateful):
    def __init__(self, run, split: str, *, dp_rank: int, dp_world_size: int, infinite: bool) -> None:
        self._stream = source.stream(run, split, rank=dp_rank, world=dp_world_size, infinite=infinite)
        self._masked = split == "train"

    def __iter__(self):
        while (row := self._stream.next_row()) is not None:
            yield tensors(row, self._masked)

    def state_dict(self) -> dict:
        return self._stream.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._stream.load_state_dict(state_dict)


def _collate(items: list[tuple[dict, torch.Tensor]]) -> tuple[dict, torch.Tensor]:
    return {k: torch.stack([x[k] for x, _ in items]) for k in items[0][0]}, torch.stack([y for _, y in items])


def pair_rows(
    run, split: str = "train", rank: int = 0, world: int = 1
) -> Iterator[tuple[dict, torch.Tensor]]:
    """Rank ``rank`` of ``world``'s share of every record of ``split``, each read once in epoch
    0's order, packed as training rows and batched ``training.local_batch_size`` rows at a time
    as the training loader yields them; the last batch is filled up with padding rows (no
    labels, ``PAIR_KEY`` -1). Records that give no pair (dropped, skipped) are in no row."""
    s: PairStream = source.stream(run, split, rank=rank, world=world, infinite=False)
    s.pad_when_spent = False  # one pass, whatever the split
    size, masked = run.training.local_batch_size, split == "train"
    batch: list = []
    while (row := s.next_row()) is not None:
        batch.append(tensors(row, masked))
        if len(batch) == size:
            yield _collate(batch)
            batch = []
    if batch:
        batch += [tensors(s.padding_row(), masked) for _ in range(size - len(batch))]
        yield _collate(batch)


class PreferenceDataLoader(ChatDataLoader):
    """Chat's loader (the same config: ``config_path``, ``split``, ``infinite``) over preference rows."""

    rows_class = PreferenceRows

    @dataclass(kw_only=True, slots=True)
    class Config(ChatDataLoader.Config):  # its own, so that Config.build() makes this class
        pass
