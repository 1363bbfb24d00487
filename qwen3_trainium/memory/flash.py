"""The target device's attention kernel, in the trace of a device run (``memory=trace``).

The trace runs torch's CPU kernels on fake tensors. For SDPA with a mask, torch 2.14's CPU path
(``aten._scaled_dot_product_flash_attention_for_cpu``) first turns the boolean mask into a float
mask of the query's dtype (``aten.where``) and keeps that ``[B, 1, L, S]`` copy for its backward;
its math fallback keeps the ``B x H x L x S`` probabilities. Neither is what a device keeps:
- CUDA: FlashAttention keeps the output and the log-sum-exp per query row and recomputes the
  probabilities in backward (``aten._flash_attention_forward`` returns ``output, logsumexp``;
  ``_flash_attention_backward`` takes ``out, logsumexp``: torch's native_functions.yaml);
- Neuron: AWS documents no memory behaviour for torch-neuronx 2.34's SDPA (not found: the release
  notes name varlen_attn and FlexAttention only). ASSUMPTION: it is a flash kernel like AWS's
  NKI one, whose forward returns ``o`` and, in training, ``lse`` (``[bs, n_heads, 128,
  seq // 128]``) and whose backward takes ``q, k, v, o, dy, lse`` and a ``logit_bias`` again,
  recomputing the softmax ("Recompute (softmax(Q^T@K + logic_bias))"):
  https://awsdocs-neuron.readthedocs-hosted.com/en/v2.21.0.beta/general/nki/api/generated/nki.kernels.flash_fwd.html
  and .../en/latest/general/nki/api/generated/nki.kernels.flash_attn_bwd.html.
So during the trace of a device run, ``F.scaled_dot_product_attention`` runs as
``flash_attention`` below: output and float32 log-sum-exp saved with q, k, v and the mask the
model passed (no float copy, no probabilities); its FLOPs are torch's SDPA counts
(``sdpa_flop_count``, grouped-query heads as the kernel broadcasts them), for the roofline.
A CPU run keeps torch's CPU kernel: that is what CPU really does.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch.utils.flop_counter import register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count


def _scores(q, k, mask, is_causal, scale):
    """Reference math (real tensors only): the scaled, masked scores, float32."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores


def _reference(q, k, v, mask, is_causal, scale):
    scores = _scores(q, k, mask, is_causal, scale)
    lse = torch.logsumexp(scores, dim=-1)
    v = v.float().repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return (torch.exp(scores - lse.unsqueeze(-1)) @ v).to(q.dtype), lse


@torch.library.custom_op("qwen3_trainium_trace::flash_attention", mutates_args=())
def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention as a flash kernel keeps it: ``(out [B, H, L, D], lse [B, H, L] float32)``."""
    return _reference(q, k, v, mask, is_causal, scale)


@flash_attention.register_fake
def _(q, k, v, mask, is_causal, scale):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("qwen3_trainium_trace::flash_attention_backward", mutates_args=())
def flash_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of q, k, v, the probabilities recomputed from the scores (reference math,
    as a flash backward does per tile): dS = P * (dP - rowsum(dO * O))."""
    rep = q.shape[1] // k.shape[1]
    probs = torch.softmax(_scores(q, k, mask, is_causal, scale), dim=-1)
    dout = grad_out.float()
    kf, vf = (t.float().repeat_interleave(rep, dim=1) for t in (k, v))
    out = probs @ vf
    dprobs = dout @ vf.transpose(-2, -1)
    dscores = probs * (dprobs - (dout * out).sum(-1, keepdim=True)) * scale
    dq = dscores @ kf
    dk = (dscores.transpose(-2, -1) @ q.float()).unflatten(1, (k.shape[1], rep)).sum(2)
    dv = (probs.transpose(-2, -1) @ dout).unflatten(1, (v.shape[1], rep)).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@flash_attention_backward.register_fake
def _(grad_out, q, k, v, mask, is_causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output) -> None:
    q, k, v, mask, ctx.is_causal, ctx.scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], mask)  # what the kernel's backward reads


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, _out, _lse, mask = ctx.saved_tensors
    dq, dk, dv = flash_attention_backward(grad_out, q, k, v, mask, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None, None


flash_attention.register_autograd(_backward, setup_context=_setup)


@register_flop_formula(torch.ops.qwen3_trainium_trace.flash_attention)
def _forward_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(q_shape, k_shape, v_shape)


@register_flop_formula(torch.ops.qwen3_trainium_trace.flash_attention_backward)
def _backward_flops(grad_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_shape, q_shape, k_shape, v_shape)


def flash_sdpa(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """``F.scaled_dot_product_attention``'s signature, run as ``flash_attention``."""
    if dropout_p:
        raise ValueError("the trace's flash attention models dropout_p=0 only (training here has none)")
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    return flash_attention(query, key, value, attn_mask, is_causal, scale)[0]


@contextlib.contextmanager
def device_attention(device_type: str):
    """``F.scaled_dot_product_attention`` as the device's flash kernel, for a non-CPU run."""
    if device_type == "cpu":
        yield
        return
    original = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = flash_sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
