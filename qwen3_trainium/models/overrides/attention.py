"""Causal SDPA that honours document boundaries: the attention that trains on every device.

torchtitan's own ``ScaledDotProductAttention`` is causal over the whole packed row (it
rejects masks), so documents packed into one sample would see each other. This backend is a
``VarlenAttention.Config`` subclass, so torchtitan's trainer builds the per-document
``VarlenMetadata`` for it from the positions the dataloader emits (pure torch, any device);
the forward turns those cumulative offsets into a block-diagonal causal mask and runs
``F.scaled_dot_product_attention``, which has a backward on CPU, CUDA and Neuron.

Activated with ``override.imports`` (``model.attn_backend=sdpa``): the model is built with
torchtitan's varlen backend and this override swaps every inner attention node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchtitan.config import derive, override
from torchtitan.models.common.attention import VarlenAttention, VarlenMetadata
from torchtitan.protocols.module import Module

from qwen3_trainium.models.context_parallel import ContextParallelMask


def document_causal_mask(cu_seqlens: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
    """Boolean ``[B, 1, L, L]`` mask: True where query i may attend key j.

    ``cu_seqlens`` are document start offsets into the flattened ``B*L`` tokens plus the
    total, as built by ``create_varlen_metadata_for_document``.
    """
    tokens = torch.arange(batch * seq_len, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    doc_ids = torch.searchsorted(cu_seqlens, tokens, right=True).view(batch, seq_len)
    same_doc = doc_ids.unsqueeze(2) == doc_ids.unsqueeze(1)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=cu_seqlens.device).tril()
    return (same_doc & causal).unsqueeze(1)


class DocumentCausalSDPA(VarlenAttention):
    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        pass

    def __init__(self, config: Config) -> None:
        Module.__init__(self)  # skip VarlenAttention's CUDA flash-attention setup
        self.window_size = config.window_size

    def forward(
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks: VarlenMetadata | None = None,
        scale: float | None = None,
        enable_gqa: bool = False,
        **kwargs,
    ) -> torch.Tensor:
        out_BNLH = F.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2),
            k_BLNH.transpose(1, 2),
            v_BLNH.transpose(1, 2),
            scale=scale,
            enable_gqa=enable_gqa,
            **self._mask(q_BLNH, attention_masks),
        )
        return out_BNLH.transpose(1, 2)

    def _mask(self, q_BLNH: torch.Tensor, attention_masks: VarlenMetadata) -> dict:
        """SDPA's masking arguments: the block-diagonal causal mask of the row's documents."""
        batch, seq_len = q_BLNH.shape[:2]
        return {"attn_mask": document_causal_mask(attention_masks.cu_seq_q, batch, seq_len)}


@override(
    target=VarlenAttention.Config,
    exact=True,
    description="causal SDPA with per-document masking (trains on cpu, cuda, neuron)",
)
def document_sdpa(cfg: VarlenAttention.Config) -> DocumentCausalSDPA.Config:
    return derive(cfg, DocumentCausalSDPA.Config)


class CausalSDPA(DocumentCausalSDPA):
    """Causal over the whole row, documents ignored (``model.attn_backend=causal``): SDPA's
    ``is_causal`` path, no mask tensor. Correct only when a row holds one sample (chat data with
    ``data.packing=false``); pre-flight refuses it for packed rows."""

    @dataclass(kw_only=True, slots=True)
    class Config(DocumentCausalSDPA.Config):
        pass

    def _mask(self, q_BLNH, attention_masks) -> dict:
        return {"is_causal": True}  # no mask tensor: SDPA's own causal path


@override(
    target=VarlenAttention.Config,
    exact=True,
    description="causal SDPA over the whole row (one sample per row only)",
)
def causal_sdpa(cfg: VarlenAttention.Config) -> CausalSDPA.Config:
    return derive(cfg, CausalSDPA.Config)


class ContextParallelSDPA(Module):
    """``sdpa``/``causal`` under context parallel (``models/context_parallel.py``): local queries
    against all keys, through the mask the trainer built for this rank's shard of the row.

    A plain torchtitan ``Module``, neither ``VarlenAttention`` nor ``ScaledDotProductAttention``:
    torchtitan refuses CP for those two classes (``Qwen3Model.Config.update_from_config``,
    ``distributed/full_dtensor.validate_config``) because ITS kernels cannot shard them; this
    one does its own sharding. The trainer puts it in place of the varlen node before torchtitan
    builds the model (``rank/context_parallel.py``, ``use_context_parallel_attention``)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Module.Config):
        window_size: tuple[int, int] = (-1, 0)  # copied from the varlen node; full causal only

    def __init__(self, config: Config) -> None:
        super().__init__()

    def forward(
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks: ContextParallelMask,
        scale: float | None = None,
        enable_gqa: bool = False,
        **kwargs,
    ) -> torch.Tensor:
        if not isinstance(attention_masks, ContextParallelMask):  # a forward outside the trainer's step
            raise RuntimeError(
                "context parallel: this forward has no CP mask; only the trainer's and validator's"
                " batches are split over the CP ranks (greedy samples, the export check and the passkey"
                " eval are refused with CP before launch: parent/preflight/context.py)"
            )
        allowed = attention_masks.allowed
        if k_BLNH.shape[1] != allowed.shape[-1]:
            raise RuntimeError(
                f"context parallel: {k_BLNH.shape[1]} keys arrived for a mask over {allowed.shape[-1]}:"
                " K/V were not all-gathered over the CP group (torchtitan's spmd_types local_map,"
                " decoder_sharding.set_gqa_inner_attention_local_map, a seam in config/seams.py)"
            )
        out_BNLH = F.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2),
            k_BLNH.transpose(1, 2),
            v_BLNH.transpose(1, 2),
            attn_mask=attention_masks.additive(q_BLNH.dtype),
            scale=scale,
            enable_gqa=enable_gqa,
        )
        return out_BNLH.transpose(1, 2)


def context_parallel_config(cfg: Module.Config) -> ContextParallelSDPA.Config | None:
    """The CP node for a model=native/nki_moe inner attention built as varlen for ``sdpa``
    (documents) or ``causal`` (whole row); None for any other node (flex: torchtitan's own CP)."""
    if type(cfg) is not VarlenAttention.Config:
        return None
    return derive(cfg, ContextParallelSDPA.Config)
