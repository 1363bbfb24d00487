"""The reference log-probs of ``objective=dpo`` with ``reference=precompute`` (full fine-tuning):
computed once, before step 1, by a no-grad pass of the reference weights over a split's pairs,
stored, and looked up by record index in every step. TRL 1.16.0's ``precompute_ref_log_probs``
(``DPOTrainer._precompute_ref_logps``, ``trl/trainer/dpo_trainer.py``), which with no separate
reference model runs the policy itself before training, as this does.

``prepare(trainer, split)`` runs at the trainer's first step boundary, after the checkpoint load
(``rank/dpo.py``): it loads the table when one with the same key exists (``dpo_reference_key.py``:
data, reference weights, numerics), else, in a run that starts at step 0, runs the pre-pass:
every data-parallel rank its share of the split's pairs, packed as training rows
(``data/preference/source.pair_rows``), summed by ``trainer.dpo_side_sums`` with the model in
``eval()`` mode and no grad (torchtitan's MoE counts ``tokens_per_expert`` only in training mode,
``torchtitan/models/common/moe.py``, and the router ledger only with grad,
``models/moe_balance.py``: the pre-pass moves neither), then gathered so that every rank holds
the whole table (a later run with another world size reuses it), and written atomically by local
rank 0 of each node (no shared filesystem needed). A resumed run holds trained weights: without
its table it stops, naming the file and the fix.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

import torch
import torch.distributed as dist
from torchtitan.tools.logging import logger

from qwen3_trainium.data.chat.loader import MASK_KEY
from qwen3_trainium.data.preference import PAIR_KEY
from qwen3_trainium.rank.dpo_reference_key import key_fields, missing_on_resume, short_on_resume, table_path


class ReferenceMissing(RuntimeError):
    """A resumed run without the reference table it was started with."""


class ReferenceTable:
    """The reference's summed completion log-probs, by record index of one split: ``chosen[i]``,
    ``rejected[i]`` (float64), ``present[i]`` (the record's pair was scored: a pair that did not
    fit ``seq_len`` with ``data.overflow=drop`` was not), computed at ``seq_len``."""

    def __init__(self, chosen: torch.Tensor, rejected: torch.Tensor, present: torch.Tensor, seq_len: int):
        self.chosen = chosen.to(torch.float64)
        self.rejected = rejected.to(torch.float64)
        self.present = present.to(torch.bool)
        self.seq_len = int(seq_len)
        self._device_copy: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.chosen.numel()

    def covers(self, seq_len: int) -> bool:
        """Whether every pair a run at ``seq_len`` trains on has its sums here: every record
        was scored, or the run keeps no more pairs than this one's (a shorter ``seq_len``)."""
        return bool(self.present.all()) or seq_len <= self.seq_len

    def _values(self, device: torch.device) -> torch.Tensor:
        """[N + 1, 2] float32 on ``device``: row i = (chosen, rejected) of record i, row N zeros
        (where ``lookup`` sends the empty slots, ``pairs < 0``). Float32: the policy's sums it
        is compared with are (``compute_logprobs``)."""
        cached = self._device_copy
        if cached is not None and cached.device == device:
            return cached
        values = torch.stack([self.chosen, self.rejected], dim=1).to(torch.float32)
        values = torch.cat([values, values.new_zeros(1, 2)]).to(device)
        from torch._subclasses.fake_tensor import is_fake

        if not is_fake(values):  # under memory=trace's FakeTensorMode: a fake copy is not kept
            self._device_copy = values
        return values

    def lookup(self, pairs: torch.Tensor) -> torch.Tensor:
        """pairs: LongTensor [B, P] of record indices (-1: no pair) -> [B, 2P] float32, the
        chosen sum at 2j, the rejected at 2j+1, 0 where pairs < 0. A gather into fixed shapes
        (no ``.item()``, no boolean indexing): safe under FakeTensor and compile."""
        values = self._values(pairs.device)
        empty = torch.full_like(pairs, len(self))
        rows = torch.where(pairs >= 0, pairs, empty)
        picked = torch.index_select(values, 0, rows.reshape(-1))
        return picked.reshape(pairs.shape[0], 2 * pairs.shape[1])

    def save(self, path: str, metadata: dict[str, str] | None = None) -> None:
        """Written to a temporary file beside ``path``, then renamed over it (``os.replace`` is
        atomic on POSIX): a reader never sees half a table, and two nodes writing the same table
        to a shared filesystem leave one whole copy."""
        from safetensors.torch import save_file

        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
        tensors = {"chosen": self.chosen, "rejected": self.rejected, "present": self.present.to(torch.uint8)}
        save_file(tensors, tmp, metadata={**(metadata or {}), "seq_len": str(self.seq_len)})
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> ReferenceTable:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            seq_len = int(f.metadata()["seq_len"])
            t = {name: f.get_tensor(name) for name in ("chosen", "rejected", "present")}
        return cls(t["chosen"], t["rejected"], t["present"], seq_len)


def _run(trainer):
    from qwen3_trainium.config import runconfig

    run = runconfig.load(trainer.config.dpo.config_path)
    run.training.seq_len = trainer.config.training.seq_len  # as the loaders do
    return run


_GLOO: list = []


def host_group():
    """A gloo group over every rank (None without torch.distributed): the table's agreement and
    gather run on the host, whatever the accelerator's backend (as ``rank/trainer.py``'s
    ``agreement_group``). Made once per process, by every rank at the same point."""
    if not dist.is_initialized():
        return None
    if not _GLOO:
        _GLOO.append(dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo"))
    return _GLOO[0]


def _all(flag: bool, group) -> bool:
    """``flag`` on every rank."""
    if group is None:
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return bool(t.item())


def _existing(path: str, seq_len: int, group) -> ReferenceTable | None:
    """The table at ``path`` when every rank has it and it covers ``seq_len``."""
    table = ReferenceTable.load(path) if os.path.isfile(path) else None
    usable = table is not None and table.covers(seq_len)
    return table if _all(usable, group) else None


def prepare(trainer, split: str) -> ReferenceTable:
    """The reference table of ``split`` (train, validation): reused, or computed now (step 0).
    The trainer asks for both at its first step boundary (``rank/dpo.py``; the held-out one
    through ``dpo_validator.bind``): both need the weights the run starts from."""
    run = _run(trainer)
    path = table_path(run, split)
    group = host_group()
    table = _existing(path, run.training.seq_len, group)
    if table is not None:
        logger.info(f"reference log-probs: reused {path}")
        return table
    if trainer.step > 0 and os.path.isfile(path):
        computed = ReferenceTable.load(path).seq_len
        raise ReferenceMissing(short_on_resume(path, split, trainer.step, computed, run.training.seq_len))
    if trainer.step > 0:
        raise ReferenceMissing(missing_on_resume(path, split, trainer.step))
    begin = time.monotonic()
    with reference_weights(trainer, run.objective.dpo.reference_path):
        table = pre_pass(trainer, run, split, group)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        table.save(path, {"key_fields": _json(key_fields(run, split))})
    seconds = time.monotonic() - begin
    logger.info(f"reference log-probs: computed {int(table.present.sum())} pairs in {seconds:.1f} s, {path}")
    return table


def _json(fields: dict) -> str:
    import json

    return json.dumps(fields, sort_keys=True, default=str)


@contextlib.contextmanager
def reference_weights(trainer, path: str):
    """With ``path`` (``objective.dpo.reference_path``, an HF directory): the model holds that
    checkpoint's weights inside, loaded as torchtitan loads ``initial_load_in_hf``
    (``CheckpointManager.dcp_load(from_hf=True)``, ``components/checkpointer/dcp.py``), and the
    policy's own after. The copy of the policy's weights costs one more set of parameters, at step
    0, before the optimizer has allocated its states (lazily, at the first step): within what
    training holds."""
    if not path:
        yield
        return
    from torchtitan.components.checkpointer.base import MODEL

    ckpt = trainer.checkpointer
    wrapper = ckpt.states[MODEL]
    policy = {k: v.detach().clone() for k, v in wrapper.state_dict().items()}
    ckpt.dcp_load(wrapper.state_dict(), checkpoint_id=path, from_hf=True, from_quantized=False)
    try:
        yield
    finally:
        wrapper.load_state_dict(policy)
        del policy


def pre_pass(trainer, run, split: str, group) -> ReferenceTable:
    """Every rank's share of ``split``'s pairs through ``trainer.dpo_side_sums`` (eval, no
    grad), gathered: the whole table on every rank."""
    from qwen3_trainium.rank import dpo_reference_rows as rows

    rank, world = rows.batch_rank(trainer)
    keys = (MASK_KEY,) if split == "train" else ()  # the row contract: training rows carry it
    empty = rows.padding(trainer.config.training.local_batch_size, run.training.seq_len, keys)
    found = []
    with rows.eval_mode(trainer.model_parts), torch.no_grad():
        for input_dict, labels in rows.lockstep(rows.batches(trainer, run, split, rank, world), group, empty):
            pairs = input_dict[PAIR_KEY]
            sums = trainer.dpo_side_sums(input_dict, labels)  # it moves them to its device
            found.append(rows.entries(pairs, sums))
    return _table(rows.gather(found, group), rows.records(run, split), run.training.seq_len)


def _table(entries: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], n: int, seq_len: int):
    chosen, rejected = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    present = torch.zeros(n, dtype=torch.bool)
    for idx, c, r in entries:  # ranks of one tensor/context-parallel group hold the same pairs
        chosen[idx], rejected[idx], present[idx] = c, r, True
    return ReferenceTable(chosen, rejected, present, seq_len)
