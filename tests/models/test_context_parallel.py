"""Context parallel's attention in one process (models/context_parallel.py, the CP node in
overrides/attention.py, the trainer's swap in rank/context_parallel.py): each simulated CP rank's
queries against the gathered keys give the rows, and the summed gradients, of the whole-row
document-masked SDPA; the mask against one written out by hand."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import resolve
from torchtitan.models.common.attention import VarlenAttention

from qwen3_trainium.models.context_parallel import ContextParallelMask, document_ids, row_mask
from qwen3_trainium.models.overrides.attention import ContextParallelSDPA, DocumentCausalSDPA
from qwen3_trainium.rank.context_parallel import use_context_parallel_attention
from qwen3_trainium.rank.titan import to_trainer_config

# one row of 8 tokens, three documents: positions reset to 0 where one starts
POSITIONS = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2]])
# head-tail over CP 2, written out: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (of 2 tokens)
HEADTAIL = [[0, 1, 6, 7], [2, 3, 4, 5]]


def _allowed_by_hand(i: int, j: int) -> bool:
    doc = [0, 0, 0, 1, 1, 2, 2, 2]
    return j <= i and doc[i] == doc[j]


def _rank_mask(rank: int, documents: bool = True) -> torch.Tensor:
    keys = torch.tensor([sum(HEADTAIL, [])])  # gathered in rank order
    queries = torch.tensor([HEADTAIL[rank]])
    doc = document_ids(POSITIONS)
    if not documents:
        return row_mask(queries, None, keys, None)
    return row_mask(queries, doc[:, queries[0]], keys, doc[:, keys[0]])


def test_rank_masks_are_the_hand_written_document_causal_mask_in_load_balanced_order():
    order = sum(HEADTAIL, [])
    for rank, queries in enumerate(HEADTAIL):
        expected = torch.tensor([[_allowed_by_hand(i, j) for j in order] for i in queries])
        assert torch.equal(_rank_mask(rank)[0, 0], expected)


def test_causal_rank_masks_ignore_documents():
    order = sum(HEADTAIL, [])
    expected = torch.tensor([[j <= i for j in order] for i in HEADTAIL[1]])
    assert torch.equal(_rank_mask(1, documents=False)[0, 0], expected)


def _qkv(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 8, 4, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 8, 2, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 8, 2, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    return q, k, v


def test_cp_ranks_give_the_whole_row_attention_and_its_gradients():
    from torchtitan.models.common.attention import create_varlen_metadata_for_document

    q, k, v = _qkv()
    whole = DocumentCausalSDPA(DocumentCausalSDPA.Config())
    metadata = create_varlen_metadata_for_document(POSITIONS)
    reference = whole(q, k, v, attention_masks=metadata, scale=0.25, enable_gqa=True)
    weights = torch.randn(reference.shape, dtype=torch.float64)
    (reference * weights).sum().backward()
    expected_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None

    node = ContextParallelSDPA(ContextParallelSDPA.Config())
    order = sum(HEADTAIL, [])
    total = 0
    for rank, queries in enumerate(HEADTAIL):
        mask = ContextParallelMask(allowed=_rank_mask(rank))
        out = node(q[:, queries], k[:, order], v[:, order], attention_masks=mask, scale=0.25, enable_gqa=True)
        torch.testing.assert_close(out, reference[:, queries], rtol=0, atol=1e-12)
        total = total + (out * weights[:, queries]).sum()
    total.backward()  # K/V gradients summed over ranks: what the gather's reduce-scatter does
    for got, expected in zip((q.grad, k.grad, v.grad), expected_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_local_keys_are_refused_naming_the_gather():
    q, k, v = _qkv()
    node = ContextParallelSDPA(ContextParallelSDPA.Config())
    mask = ContextParallelMask(allowed=_rank_mask(0))
    with pytest.raises(RuntimeError, match="not all-gathered over the CP group"):
        node(q[:, :4], k[:, :4], v[:, :4], attention_masks=mask)


def _inner(config) -> list:
    return [layer.attention.inner_attention for layer in config.model_spec.model.layers]


@pytest.mark.parametrize(("backend", "documents"), [("sdpa", True), ("causal", False)])
def test_the_trainer_swaps_every_varlen_node_so_torchtitan_accepts_cp(tmp_path, backend, documents):
    config = to_trainer_config(resolve("parallel=cpu2_cp2", f"model.attn_backend={backend}"), str(tmp_path))
    with pytest.raises(NotImplementedError, match="Varlen attention is not supported with CP"):
        copy.deepcopy(config).model_spec.model.update_from_config(config=config)
    assert use_context_parallel_attention(config) is documents
    assert all(type(node) is ContextParallelSDPA.Config for node in _inner(config))
    assert not any("attention" in str(entry) for entry in config.override.imports)
    config.model_spec.model.update_from_config(config=config)  # torchtitan's CP guard passes


@pytest.mark.parametrize("overrides", [["parallel=cpu2"], ["parallel=cpu2_cp2", "model=hf"]])
def test_no_swap_without_cp_or_on_the_hf_path(tmp_path, overrides):
    config = to_trainer_config(resolve(*overrides), str(tmp_path))
    assert use_context_parallel_attention(config) is None
    if hasattr(config.model_spec.model, "layers"):
        assert all(type(node) is VarlenAttention.Config for node in _inner(config))


def test_a_forward_without_the_cp_mask_is_refused_naming_what_is_split():
    q, k, v = _qkv()
    node = ContextParallelSDPA(ContextParallelSDPA.Config())
    with pytest.raises(RuntimeError, match="this forward has no CP mask"):
        node(q, k, v, attention_masks=None)
