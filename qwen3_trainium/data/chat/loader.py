"""torchtitan's dataloader seam for chat data (rank side): ``ChatRows`` is the dataset,
``ChatDataLoader`` the ``ParallelAwareDataloader`` (a ``StatefulDataLoader``) torchtitan builds
from ``Trainer.Config.dataloader`` and ``Validator.Config.dataloader``.

torchtitan 0.3.0's own ``ChatDataset`` (``hf_datasets/text_datasets.py``) takes one
``[user, assistant]`` pair and masks by prefix; this one takes whole conversations and the exact
masks of ``masks.py``, and yields what torchtitan's trainer expects of its loaders:
``({"input": ids, "positions": positions}, labels)``, labels ``-100`` where unsupervised. The
trainer counts the supervised labels across ranks and micro-batches (``global_valid_tokens``,
``Trainer.train_step``) and divides the summed loss by that, so every supervised token weighs the
same whatever row or rank it is in. The data state goes into each checkpoint (torchtitan saves
the dataloader's ``state_dict`` per data-parallel rank), so a resumed run reads the same rows; it
carries the data's identity, and a resume on other data is refused (``data/identity.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader

from qwen3_trainium.config import runconfig
from qwen3_trainium.data.chat import source

# Training rows also carry which tokens are not padding (1; prompts included), the mask of
# Transformers' router load-balancing loss; the trainer takes it out of the batch before the model
# (rank/moe_balance.py). Validation rows do not: torchtitan's Validator would pass it to the model.
MASK_KEY = "moe_token_mask"


class ChatRows(IterableDataset, Stateful):
    def __init__(self, run, split: str, *, dp_rank: int, dp_world_size: int, infinite: bool) -> None:
        self._stream = source.stream(run, split, rank=dp_rank, world=dp_world_size, infinite=infinite)
        self._masked = split == "train"

    def __iter__(self):
        while (row := self._stream.next_row()) is not None:
            batch = {"input": torch.tensor(row.input_ids), "positions": torch.tensor(row.positions)}
            if self._masked:
                batch[MASK_KEY] = torch.arange(len(row.input_ids)) < row.real
            yield batch, torch.tensor(row.labels)

    def state_dict(self) -> dict:
        return self._stream.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._stream.load_state_dict(state_dict)


class ChatDataLoader(ParallelAwareDataloader):
    rows_class: type = ChatRows  # the dataset (data/preference/loader.py: PreferenceRows)

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        config_path: str = ""
        """The run's resolved.yaml: the data section and seq_len are read from it."""

        split: str = "train"
        """train, or validation (eval=on's held-out records)."""

        infinite: bool = True
        """train: loop over epochs. validation: torchtitan's Validator sets it whenever eval.steps is
        set; the held-out share is then read once and padded (``data/chat/stream.py``)."""

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
        run = runconfig.load(config.config_path)
        run.training.seq_len = seq_len
        rows = self.rows_class(
            run, config.split, dp_rank=dp_rank, dp_world_size=dp_world_size, infinite=config.infinite
        )
        super().__init__(
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
