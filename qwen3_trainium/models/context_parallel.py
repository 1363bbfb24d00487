"""Context parallel for this project's document-masked SDPA (``model.attn_backend=sdpa|causal``
with ``parallel.context_parallel_degree > 1``), on any device torch SDPA has a backward for
(CPU with gloo, CUDA, Neuron).

How: torchtitan shards the row (inputs, labels, positions) over the CP ranks with its own
``cp_shard`` and its head-tail load balancer (``context_parallel_load_balancer="headtail"``, its
default: ``torchtitan/distributed/context_parallel/api.py``), RoPE reads the sharded global
positions, and every rank's attention sees its local queries against ALL keys: K and V arrive
all-gathered over the CP group. That gather is torchtitan's own under ``spmd_backend=spmd_types``
(its default, the only one this project sets): declared on the inner attention's ``local_map``,
K/V ``cp=Replicate`` in (an all-gather), their gradients ``cp=Partial`` out (a reduce-scatter)
(``models/common/decoder_sharding.py``, ``set_gqa_inner_attention_local_map``), as for its own
FlexAttention CP. Seen on CPU/gloo: K/V reach the attention at the full row length.

The mask is local query rows x gathered key columns, built once per step from the whole row's
positions (documents start where the position is 0, torchtitan's convention in
``create_varlen_metadata_for_document``): each token's global index and document id go through
the same ``cp_shard`` as the inputs, and the keys' order is their all-gather (rank order), so the
mask holds whatever balancer sharded the row.

Why not torchtitan's own CP on CPU: its SDPA ring attention dispatches only the CUDA
flash/efficient/cudnn SDPA ops (``torch/distributed/tensor/experimental/_context_parallel/
_attention.py``), FlexAttention has no backward on CPU (``torch/nn/attention/flex_attention.py``,
``_validate_device``), and ``cp_shard`` shards only BlockMask masks, so no dense document mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed._functional_collectives as funcol


@dataclass
class ContextParallelMask:
    """The attention masks torchtitan hands to every inner attention under our CP: ``allowed``,
    bool ``[B, 1, S/cp, S]``, True where the local query may attend the gathered key.

    ``additive(dtype)`` is SDPA's float form of it (0 or -inf, what SDPA itself turns a bool mask
    into with ``torch.where`` on every call), made once per step and shared by every layer: SDPA
    keeps its mask for the backward, so a bool mask would leave one float copy per layer."""

    allowed: torch.Tensor
    _additive: dict = field(default_factory=dict, repr=False)

    def additive(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._additive:
            zero = torch.zeros((), dtype=dtype, device=self.allowed.device)
            self._additive[dtype] = torch.where(self.allowed, zero, float("-inf"))
        return self._additive[dtype]


def document_ids(positions: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` document number of every token: a document starts where its position is 0
    (tokens before a row's first 0 belong to a document carried over from the previous row)."""
    return torch.cumsum(positions == 0, dim=1)


def row_mask(
    query_index: torch.Tensor,
    query_doc: torch.Tensor | None,
    key_index: torch.Tensor,
    key_doc: torch.Tensor | None,
) -> torch.Tensor:
    """Bool ``[B, 1, Lq, Lk]``: causal on global indices, and within one document when ``*_doc``
    are given (``None``: causal over the whole row, the ``causal`` backend)."""
    allowed = query_index.unsqueeze(-1) >= key_index.unsqueeze(-2)
    if query_doc is not None:
        allowed = allowed & (query_doc.unsqueeze(-1) == key_doc.unsqueeze(-2))
    return allowed.unsqueeze(1)


def shard_mask(
    positions: torch.Tensor,
    cp_mesh,
    load_balancer: str | None,
    documents: bool = True,
) -> ContextParallelMask:
    """The mask of this rank's queries against all keys, for the whole row's ``positions``
    (``[B, S]``, before torchtitan shards them), sharded exactly as ``cp_shard`` shards the inputs."""
    from torchtitan.distributed.context_parallel import cp_shard

    batch, seq_len = positions.shape
    index = torch.arange(seq_len, device=positions.device).expand(batch, seq_len).contiguous()
    doc = document_ids(positions)
    (local_index, local_doc), _ = cp_shard(cp_mesh, (index, doc), None, load_balancer)
    group = cp_mesh.get_group()
    # keys come all-gathered in rank order: the same gather of the index and documents gives their order
    key_index = funcol.all_gather_single(local_index.contiguous(), gather_dim=1, group=group)
    key_doc = funcol.all_gather_single(local_doc.contiguous(), gather_dim=1, group=group)
    key_index, key_doc = funcol.wait_tensor(key_index), funcol.wait_tensor(key_doc)
    if not documents:
        local_doc = key_doc = None
    allowed = row_mask(local_index, local_doc, key_index, key_doc)
    return ContextParallelMask(allowed=allowed)
