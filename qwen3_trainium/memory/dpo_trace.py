"""``memory=trace`` of an ``objective=dpo`` step: the DPO trainer's own ``post_dataloading_process``
and ``_forward_backward_body`` (``rank/dpo.py`` ``DPOObjective``) on ``trace.py``'s rank, so that
the trace holds what the DPO step holds: the no-grad pass over the lm_head, the per-side sums, and
with ``reference=adapters_off`` the LoRA model's second, no-grad forward with its adapters off.

The batch is a preference row of the planned shape: one pair per row, its chosen response on the
first half of the positions and its rejected on the second (two documents, positions restarting),
every label position a completion token. The precomputed reference is a table of those rows'
pairs (``rank/dpo_reference.py`` ``ReferenceTable``): on the device it is ``lookup``'s gather from
an [N + 1, 2] float32 copy, 8 bytes a pair of the split.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map_only

from qwen3_trainium.data.preference import PAIR_KEY, SEGMENT_KEY, max_pairs
from qwen3_trainium.rank.dpo import DPOObjective
from qwen3_trainium.rank.dpo_reference import ReferenceTable


def dpo_rank(_Rank: type) -> type:
    """``trace._Rank`` (passed in: trace.py imports this module, not the other way) with the DPO
    trainer's step."""

    class DPORank(DPOObjective, _Rank):
        """``trace._Rank`` with the DPO trainer's step: ``DPOObjective.post_dataloading_process``
        takes the DPO keys out of the batch, then ``_Rank``'s (torchtitan's, with CP's mask) runs;
        ``_forward_backward_body`` is ``DPOObjective``'s. Not ``DPOObjective.__init__``: the trace
        has no metrics processor, and the step's pair count (``train_step``'s) is set here."""

        def __init__(self, *args, **kwargs) -> None:
            _Rank.__init__(self, *args, **kwargs)
            batch = self.config.training.local_batch_size
            self._dpo_global_pairs = torch.tensor(float(batch))
            if self.config.dpo.reference == "precompute":  # the rows' pairs are records 0 .. batch - 1
                zeros = torch.zeros(batch, dtype=torch.float64)
                self._dpo_reference = ReferenceTable(zeros, zeros, torch.ones(batch, dtype=torch.bool), 0)

        def rows(self):
            """One pair per row: chosen on the first half, rejected on the second."""
            train = self.config.training
            batch, length, half = train.local_batch_size, train.seq_len, train.seq_len // 2
            tokens = torch.zeros(batch, length, dtype=torch.long)
            position = torch.arange(length)
            positions = torch.where(position < half, position, position - half).repeat(batch, 1)
            segment = (position >= half).long().repeat(batch, 1)
            pairs = torch.full((batch, max_pairs(length)), -1, dtype=torch.long)
            pairs[:, 0] = torch.arange(batch)
            inputs = {"input": tokens, "positions": positions, SEGMENT_KEY: segment, PAIR_KEY: pairs}
            return inputs, tokens.clone()

        def batch(self, fake_mode):
            step_batch = super().batch(fake_mode)
            self._dpo_rows = tree_map_only(torch.Tensor, fake_mode.from_tensor, self._dpo_rows)
            self._dpo_totals = fake_mode.from_tensor(torch.zeros(7, dtype=torch.float64))
            return step_batch

    return DPORank
