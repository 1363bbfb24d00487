"""rope_hf: rotary embedding of q and k with a packed cos/sin cache, as a torch custom op.

Interface (torchtitan's layout): ``q [B, S, Hq, D]``, ``k [B, S, Hk, D]``, ``rope_cache
[B|1, S, 2D]`` (cos then sin: torchtitan's ``CosSinRoPE`` cache gathered at the positions).
``backward=True`` applies the exact VJP: the same rotation with ``-sin``, which is how the NKI
kernel computes gradients, and how this op's registered backward calls itself.

- Neuron: nki-library's ``rope_hf`` (``core/embeddings/rope_hf.py``: ``q``/``k`` as
  ``[B, H, S, D]``, ``q_out``/``k_out`` parameters, ``return q_out, k_out``), launched as
  ``rope_hf[lnc](...)`` (see ``neuron.py`` for the sources); it asserts ``S % (128 * LNC) == 0``.
- Elsewhere: ``rope_reference``, the same float32 math in the same order as ``CosSinRoPE``
  (max abs difference 0, forward and gradients).
"""

from __future__ import annotations

import torch

from qwen3_trainium.models.kernels import neuron
from qwen3_trainium.models.kernels.rules import PARTITION, check_seq_len, seq_multiple  # noqa: F401 (re-exported)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_reference(
    q: torch.Tensor, k: torch.Tensor, rope_cache: torch.Tensor, backward: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x*cos + rotate_half(x)*sin`` in float32 or wider (``-sin`` when ``backward``); [B, S, H, D]."""
    head_dim = q.shape[-1]
    cache = rope_cache.unsqueeze(2)  # [B|1, S, 1, 2D]: broadcast over heads
    cos = cache[..., :head_dim]
    sin = cache[..., head_dim:]
    if backward:
        sin = -sin
    compute = torch.promote_types(q.dtype, torch.float32)  # CosSinRoPE's .float(); float64 stays
    q_f, k_f = q.to(compute), k.to(compute)
    q_out = (q_f * cos) + (_rotate_half(q_f) * sin)
    k_out = (k_f * cos) + (_rotate_half(k_f) * sin)
    return q_out.type_as(q), k_out.type_as(k)


def gathered_cache(cache: torch.Tensor, seq_len: int, positions: torch.Tensor | None) -> torch.Tensor:
    """``[B|1, S, 2D]``: rows of torchtitan's ``CosSinRoPE`` cache (``[max_seq_len, 2D]``) at the
    positions (per document, from the dataloader), or the first ``seq_len`` rows. torchtitan sizes
    the table to ``training.seq_len``, which bounds every position the dataloader emits."""
    if positions is None:
        return cache[:seq_len].unsqueeze(0)
    if positions.dim() == 1:
        positions = positions.unsqueeze(0)
    return cache[positions]


def rope_nki(q, k, rope_cache, backward: bool, kernel, lnc: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The Neuron-side call of nki-library's ``rope_hf``: layouts in, ``kernel[lnc](...)``, and the
    results from its return value (``q_out``/``k_out`` are parameters of the kernel's signature,
    but what it returns is its output; nothing is read back from them)."""
    check_seq_len(q.shape[1], lnc)
    q_bhsd = q.transpose(1, 2).contiguous()
    k_bhsd = k.transpose(1, 2).contiguous()
    cache = rope_cache.to(q.dtype)  # the kernel holds cos/sin tiles in q's dtype
    if cache.shape[0] == 1:
        cache = cache[0]  # [S, 2D], shared by the batch
    q_out, k_out = kernel[lnc](
        q_bhsd, k_bhsd, torch.empty_like(q_bhsd), torch.empty_like(k_bhsd),
        rope_cache=cache.contiguous(), backward=backward,
    )  # fmt: skip
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


def _nki_kernel():
    return neuron.resolve("nkilib.core.embeddings.rope_hf:rope_hf")


@torch.library.custom_op("qwen3_trainium::rope_hf", mutates_args=())
def rope_hf(
    q: torch.Tensor, k: torch.Tensor, rope_cache: torch.Tensor, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    if neuron.on_neuron(q, k, rope_cache):
        q_out, k_out = rope_nki(q, k, rope_cache, backward, _nki_kernel(), neuron.lnc())
    else:
        check_seq_len(q.shape[1], neuron.lnc())  # same rule everywhere: valid here => valid on trn2
        q_out, k_out = rope_reference(q, k, rope_cache, backward)
    return q_out.contiguous(), k_out.contiguous()


@rope_hf.register_fake
def _(q, k, rope_cache, backward):
    return torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty_like(
        k, memory_format=torch.contiguous_format
    )


def _setup_context(ctx, inputs, output):
    _, _, rope_cache, backward = inputs
    ctx.save_for_backward(rope_cache)
    ctx.backward = backward


def _backward(ctx, grad_q, grad_k):
    (rope_cache,) = ctx.saved_tensors
    dq, dk = rope_hf(grad_q.contiguous(), grad_k.contiguous(), rope_cache, not ctx.backward)
    return dq, dk, None, None


rope_hf.register_autograd(_backward, setup_context=_setup_context)
