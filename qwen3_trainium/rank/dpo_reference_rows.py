"""The rows of the DPO reference pre-pass (``dpo_reference.py``): each data-parallel rank its
share of a split's pairs, in step with the other ranks, and the per-pair sums gathered to all.

Every forward of a sharded model is a collective (FSDP's all-gathers, tensor parallel's
reductions), so every rank must run as many as the others: a rank whose share is spent runs
padding rows (no pair: ``PAIR_KEY`` -1, labels -100) until no rank has rows left, as the held-out
chat stream pads (``data/chat/stream.py``, ``pad_when_spent``). Whether any rank has rows left is
one all-reduce of one int per batch, on the host (gloo).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from qwen3_trainium.data.preference import PAIR_KEY, SEGMENT_KEY, max_pairs

IGNORE = -100  # torchtitan's IGNORE_INDEX (components/loss.py)


def batch_rank(trainer) -> tuple[int, int]:
    """(rank, world) on the batch mesh: which share of the records this rank reads, as the
    trainer's dataloader (``torchtitan/trainer.py``: ``batch_mesh.get_local_rank()``)."""
    dims = trainer.parallel_dims
    if not dims.dp_enabled:
        return 0, 1
    mesh = dims.get_mesh("batch")
    return mesh.get_local_rank(), mesh.size()


@contextlib.contextmanager
def eval_mode(model_parts: list):
    """``eval()`` inside, each part's own mode after."""
    modes = [m.training for m in model_parts]
    for m in model_parts:
        m.eval()
    try:
        yield
    finally:
        for m, mode in zip(model_parts, modes, strict=True):
            m.train(mode)


def batches(trainer, run, split: str, rank: int, world: int) -> Iterable:
    from qwen3_trainium.data.preference.loader import pair_rows

    return pair_rows(run, split, rank, world)


def records(run, split: str) -> int:
    """How many records ``split`` has (the table's length: ``PAIR_KEY`` indexes them)."""
    from qwen3_trainium.data.preference import source

    return len(source.records(run, split))


def padding_like(input_dict: dict, labels: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """A batch of the same keys and shapes that holds no pair."""
    out = {}
    for k, v in input_dict.items():
        if k in (PAIR_KEY, SEGMENT_KEY):
            out[k] = torch.full_like(v, -1)
        elif k == "positions":
            out[k] = v.clone()  # any valid positions: nothing is summed
        else:
            out[k] = torch.zeros_like(v)
    return out, torch.full_like(labels, IGNORE)


def padding(batch_size: int, seq_len: int, keys: Iterable[str]) -> tuple[dict, torch.Tensor]:
    """A batch with no pair, for a rank that had no rows at all (fewer pairs than ranks)."""
    shape = (batch_size, seq_len)
    out = {
        "input": torch.zeros(shape, dtype=torch.long),
        "positions": torch.arange(seq_len).expand(shape).clone(),
    }
    out[SEGMENT_KEY] = torch.full(shape, -1, dtype=torch.long)
    out[PAIR_KEY] = torch.full((batch_size, max_pairs(seq_len)), -1, dtype=torch.long)
    for k in keys:  # e.g. the MoE token mask of training rows
        out.setdefault(k, torch.zeros(shape, dtype=torch.bool))
    return out, torch.full(shape, IGNORE, dtype=torch.long)


def _any(flag: bool, group) -> bool:
    if group is None:
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def lockstep(rows: Iterable, group, empty: tuple[dict, torch.Tensor] | None = None) -> Iterator:
    """``rows``, then padding batches while any rank still has rows (``empty`` for a rank that
    had none; else one like its first batch)."""
    it = iter(rows)
    template = empty
    while True:
        batch = next(it, None)
        if not _any(batch is not None, group):
            return
        if batch is None:
            if template is None:
                raise RuntimeError("no padding batch for a rank without rows")
            yield template
            continue
        if template is None or template is empty:
            template = padding_like(*batch)
        yield batch


def entries(pairs: torch.Tensor, sums: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(record indices, chosen sums, rejected sums) of a batch's pairs, on the host in float64.
    ``sums`` [B, 2P]: chosen at 2j, rejected at 2j+1 (``trainer.dpo_side_sums``)."""
    pairs = pairs.cpu()
    sums = sums.detach().to("cpu", torch.float64)
    keep = pairs >= 0
    return pairs[keep], sums[:, 0::2][keep], sums[:, 1::2][keep]


def gather(found: list[tuple], group) -> list[tuple]:
    """Every rank's entries, on every rank (``all_gather_object`` on the host group)."""
    empty = (
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.float64),
        torch.zeros(0, dtype=torch.float64),
    )
    local = tuple(torch.cat(parts) for parts in zip(*found, strict=True)) if found else empty
    if group is None:
        return [local]
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, local, group=group)
    return out
