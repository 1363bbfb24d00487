"""Text data for the ranks (``data.format=text``): torchtitan's ``HuggingFaceTextDataset``, rows
and state unchanged, with three things added for runs at many data-parallel ranks.

- Held-out text is read once and then padded. torchtitan's ``Validator`` runs ``eval.steps``
  batches and stops a rank at ``StopIteration`` with no cross-rank agreement
  (``components/validate.py``): a rank whose share ran out would leave the others waiting in
  collectives; and it asks for an infinite loader, which makes a small share cycle (its rows
  scored twice). Here each rank reads its share (``split_dataset_by_node``) once, then gives rows
  of padding without labels: the loss, summed over supervised tokens and divided by their count,
  is over every held-out row read, each once. A rank with no held-out record at all (fewer
  records than ranks: torchtitan's dataset fails to build, ``shares.text_split``) gives padding
  only, where it used to stop the run at its first validation.
- A training rank handed no record stops at once with the numbers, and one whose share gives no
  token in a whole pass stops at its second (torchtitan would loop over it for ever, every other
  rank waiting at the first step). Pre-flight refuses both before any process starts for local
  data (``parent/preflight/shares.py``); this is the rank's own guard, for the Hub's too.
- The state saved with each checkpoint carries the data's identity (``data/identity.py``: the
  train split's files, which records training skips, the tokenizer, ``seq_len``); a resume on
  other data is refused. torchtitan's text state (buffers, ``sample_idx``, ``epoch``) has no
  seed: its order is the files' order, reshuffled with ``42 + epoch`` from the second epoch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader, HuggingFaceTextDataset

from qwen3_trainium.data import identity as ident
from qwen3_trainium.data import shares


def train_dataset(run) -> tuple[str, str | None, str]:
    """(torchtitan dataset name, path, which records training skips) of the training stream."""
    if not run.eval.enable:
        return run.data.dataset, run.data.dataset_path, "none"
    from qwen3_trainium.data import heldout

    src = heldout.register(run)
    held = (
        f"every record the fraction {run.data.validation_fraction:g} picks"
        if src.kind == "fraction"
        else "none"
    )
    return src.train_dataset, src.train_path, held


def train_files(path: str) -> list[str]:
    """The files ``load_dataset(path, split="train")`` reads (``datasets``' own split patterns)."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        found = DataFilesDict.from_local_or_remote(get_data_patterns(path), base_path=path)
    except Exception:  # no data files (EmptyDatasetError and friends): pre-flight's corpus check says so
        return []
    return sorted(found.get("train", []))


def identity(run) -> dict:
    """What decides the training rows of text data (saved with each checkpoint)."""
    _, path, held = train_dataset(run)
    local = bool(path) and os.path.isabs(path) and os.path.isdir(path)
    return {
        "records": ident.files(train_files(path), path)
        if local
        else f"the Hub dataset {path or run.data.dataset}",
        "held_out": held,
        "tokenizer": ident.tokenizer(run.data.hf_assets_path),
        "seq_len": run.training.seq_len,
    }


class TextRows(HuggingFaceTextDataset):
    """torchtitan's text rows; ``pad_when_spent``: one pass, then padding (held-out text)."""

    def __init__(self, *, pad_when_spent: bool = False, identity: dict | None = None, **kwargs) -> None:
        rank, world = kwargs["dp_rank"], kwargs["dp_world_size"]
        self._where = f"data-parallel rank {rank} of {world}"
        try:
            super().__init__(**kwargs)
        except IndexError:  # an empty block of split_dataset_by_node (``shares.text_split``)
            if not pad_when_spent:
                raise RuntimeError(
                    f"{self._where} is handed none of the records of {kwargs['dataset_name']} (fewer records than "
                    "ranks): pre-flight refuses this for local data (dry_run=true shows it)"
                ) from None
            super().__init__(**{**kwargs, "dp_rank": 0, "dp_world_size": 1})
            self._original_data = self._data = shares.text_split(self._original_data, rank, world)
        self.pad_when_spent, self.identity = pad_when_spent, identity or {}
        self._rows_out, self._mark = 0, None

    def __iter__(self):
        for item in super().__iter__():
            self._rows_out += 1
            yield item
        while self.pad_when_spent:
            labels = torch.full((self.seq_len,), IGNORE_INDEX, dtype=torch.long)
            pad = self._tokenizer.eos_id or 0  # any id: no label reads it
            yield {"input": torch.full((self.seq_len,), pad), "positions": torch.arange(self.seq_len)}, labels

    def reloop(self) -> None:
        """A whole pass that added no token to the rows would repeat for ever: stop instead."""
        progress = (self._rows_out, len(self._inputs_buffer))
        if progress == self._mark:
            size = len(self._original_data) if hasattr(self._original_data, "__len__") else "its"
            raise RuntimeError(
                f"{self._where} makes no token from its share of {self.dataset_name} ({size} records, split by "
                "datasets.split_dataset_by_node): pre-flight refuses this for local data (dry_run=true shows it)"
            )
        self._mark = progress
        super().reloop()

    def state_dict(self) -> dict:
        return {**super().state_dict(), "identity": self.identity}

    def load_state_dict(self, state_dict: dict) -> None:
        ident.check(state_dict.get("identity"), self.identity)
        super().load_state_dict(state_dict)


class TextDataLoader(HuggingFaceTextDataLoader):
    """torchtitan's text dataloader over ``TextRows``."""

    @dataclass(kw_only=True, slots=True)
    class Config(HuggingFaceTextDataLoader.Config):
        config_path: str = ""
        """The run's resolved.yaml (training: the data's identity is computed from it)."""

        held_out: bool = False
        """The Validator's loader: with ``infinite`` (set whenever eval.steps is), one pass, then padding."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = 1,
        **kwargs,
    ) -> None:
        rows = TextRows(
            dataset_name=config.dataset,
            dataset_path=config.dataset_path,
            tokenizer=tokenizer,
            seq_len=seq_len,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            infinite=config.infinite and not config.held_out,
            pad_when_spent=config.infinite and config.held_out,
            identity=_identity(config.config_path, seq_len) if config.config_path else None,
        )
        ParallelAwareDataloader.__init__(  # torchtitan's HuggingFaceTextDataLoader, over TextRows
            self,
            rows,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            num_workers=config.num_workers,
            persistent_workers=config.persistent_workers,
            pin_memory=config.pin_memory,
            prefetch_factor=config.prefetch_factor,
            snapshot_every_n_steps=snapshot_every_n_steps,
            batch_size=local_batch_size,
        )


def _identity(config_path: str, seq_len: int) -> dict:
    from qwen3_trainium.config import runconfig

    run = runconfig.load(config_path)
    run.training.seq_len = seq_len
    return identity(run)
