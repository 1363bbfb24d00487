"""The document-masked SDPA backend equals attention run on each document separately."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchtitan.models.common.attention import create_varlen_metadata_for_document

from qwen3_trainium.models.overrides.attention import DocumentCausalSDPA, document_causal_mask, document_sdpa


def _positions(doc_lengths: list[list[int]]) -> torch.Tensor:
    return torch.tensor([[p for n in row for p in range(n)] for row in doc_lengths])


def test_mask_is_block_diagonal_causal():
    positions = _positions([[2, 3], [5]])
    meta = create_varlen_metadata_for_document(positions)
    mask = document_causal_mask(meta.cu_seq_q, 2, 5)[:, 0]
    expected0 = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]],
        dtype=torch.bool,
    )
    assert torch.equal(mask[0], expected0)
    assert torch.equal(mask[1], torch.ones(5, 5, dtype=torch.bool).tril())


def test_forward_and_backward_match_per_document_attention():
    torch.manual_seed(0)
    docs = [[3, 4, 1], [8]]
    batch, seq, heads, kv_heads, dim = 2, 8, 4, 2, 16
    q = torch.randn(batch, seq, heads, dim, requires_grad=True)
    k = torch.randn(batch, seq, kv_heads, dim, requires_grad=True)
    v = torch.randn(batch, seq, kv_heads, dim, requires_grad=True)
    attn = DocumentCausalSDPA(DocumentCausalSDPA.Config())
    meta = create_varlen_metadata_for_document(_positions(docs))
    out = attn(q, k, v, attention_masks=meta, enable_gqa=True)

    pieces = []
    for b, row in enumerate(docs):
        start = 0
        for n in row:
            sl = slice(start, start + n)
            part = F.scaled_dot_product_attention(
                q[b : b + 1, sl].transpose(1, 2),
                k[b : b + 1, sl].transpose(1, 2),
                v[b : b + 1, sl].transpose(1, 2),
                is_causal=True,
                enable_gqa=True,
            )
            pieces.append(part.transpose(1, 2))
            start += n
    reference = torch.cat([torch.cat(pieces[:3], dim=1), pieces[3]], dim=0)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-6)

    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(reference, (q, k, v), grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)


def test_override_factory_keeps_the_varlen_fields():
    from torchtitan.models.common.attention import VarlenAttention

    replaced = document_sdpa(VarlenAttention.Config(window_size=(-1, 0)))
    assert type(replaced) is DocumentCausalSDPA.Config
    assert replaced.window_size == (-1, 0)
    # isinstance keeps torchtitan's trainer building VarlenMetadata for it
    assert isinstance(replaced, VarlenAttention.Config)
