"""Long-context memory: the estimate's RoPE-cache and context-parallel terms against hand-computed
bytes, and the trace's model of the device's attention kernel (memory/flash.py) against torch's
own SDPA (values) and torch's CPU kernel (what it keeps for backward)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import resolve

from qwen3_trainium.memory import estimate, flash, sequence
from tests.support.published_shapes import QWEN3_30B_A3B

GiB = 2**30


def _neuron(*overrides: str):
    return resolve("model=native", "model.flavor=30B-A3B", "device=neuron", *overrides)


@pytest.mark.parametrize(("seq", "gib"), [(32768, 1.5), (131072, 6.0)])
def test_the_rope_cache_is_seq_by_twice_head_dim_float32_in_every_layer(seq, gib):
    """48 layers x seq x 256 x 4 bytes: 1.5 GiB at 32,768, 6 GiB at 131,072, on every rank."""
    for layout in ("parallel=trn2_tp4_fsdp16", "parallel=trn2_dp64"):
        run = _neuron(layout, f"training.seq_len={seq}")
        assert sequence.rope_table_bytes(run, QWEN3_30B_A3B) == gib * GiB
        parts = estimate.estimate(run, QWEN3_30B_A3B, dp_shard=16, capacity=None).parts
        assert parts["RoPE cache (fp32)"] == gib * GiB


def test_the_hf_path_keeps_no_rope_cache():
    run = resolve("model=hf", "device=neuron", "training.seq_len=32768")
    assert sequence.rope_table_bytes(run, QWEN3_30B_A3B) == 0


def test_context_parallel_counts_gathered_kv_one_mask_and_local_queries():
    """CP 4 at 32,768 tokens, TP 1, bfloat16, full checkpointing: K and V gathered to the whole
    row in the recomputed layer, [1, 32768, 4 x 128] x 2 bytes each, and as much again for their
    gradients (4 x 32 MiB); the rank's one [1, 1, 8192, 32768] mask, boolean and bfloat16, made once
    per step (768 MiB); no
    probabilities on a device; and the saved activations of 8,192 local tokens, not 32,768."""
    base = (
        "parallel=trn2_dp64",
        "training.seq_len=32768",
        "training.local_batch_size=1",
        "activation_checkpoint.mode=full",
    )
    cp4 = estimate.estimate(
        _neuron(*base, "parallel.context_parallel_degree=4"), QWEN3_30B_A3B, dp_shard=16, capacity=None
    ).parts
    cp1 = estimate.estimate(_neuron(*base), QWEN3_30B_A3B, dp_shard=64, capacity=None).parts
    assert cp4["CP gathered K/V (+ grad)"] == 4 * 32768 * 512 * 2 == 128 * 2**20
    assert cp4["CP mask (bool + float)"] == 8192 * 32768 * (1 + 2) == 768 * 2**20
    assert "attention matrices" not in cp4
    assert cp4["activations"] * 4 == cp1["activations"]
    assert cp4["MoE routed tokens"] * 4 == cp1["MoE routed tokens"] == 32768 * 8 * 2048 * 18


def test_on_cpu_the_probabilities_are_local_queries_by_all_keys():
    """On CPU (torch's kernels, at their worst the math kernel): B x H x S/cp x S, twice (the
    probabilities and their softmax input), float32: 1 x 32 x 2048 x 4096 x 2 x 4 bytes."""
    run = resolve(
        "model=native",
        "device=cpu",
        "training.seq_len=4096",
        "parallel.context_parallel_degree=2",
        "training.local_batch_size=1",
        "activation_checkpoint.mode=full",
    )
    parts = sequence.attention_parts(run, QWEN3_30B_A3B, compute=4, layers=48)
    assert parts["attention matrices"] == 32 * 2048 * 4096 * 2 * 4


def _saved(device_type: str, q, k, v, mask) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """What one SDPA call keeps for its backward (shape, dtype), as autograd saves it."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with flash.device_attention(device_type), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return saved


def _inputs(batch=2, heads=8, kv_heads=2, seq=64, dim=16, dtype=torch.bfloat16):
    torch.manual_seed(0)
    q = torch.randn(batch, heads, seq, dim, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(batch, kv_heads, seq, dim, dtype=dtype, requires_grad=True) for _ in range(2))
    mask = torch.ones(batch, 1, seq, seq, dtype=torch.bool).tril()
    mask[1, :, seq // 2 :, : seq // 2] = False  # two documents in the second row
    return q, k, v, mask


def test_a_device_run_keeps_output_and_logsumexp_not_a_float_copy_of_the_mask():
    """torch's CPU kernel keeps a [B, 1, L, S] copy of the mask in the query's dtype; the device
    model keeps q, k, v, the output, a float32 log-sum-exp per query row and the boolean mask the
    model passed, nothing of L x S in a float dtype."""
    q, k, v, mask = _inputs()
    square = (2, 1, 64, 64)
    cpu = _saved("cpu", q, k, v, mask)
    assert (square, torch.bfloat16) in cpu
    device = _saved("neuron", q, k, v, mask)
    assert sorted(device, key=str) == sorted(
        [
            ((2, 8, 64, 16), torch.bfloat16),
            ((2, 2, 64, 16), torch.bfloat16),
            ((2, 2, 64, 16), torch.bfloat16),
            ((2, 8, 64, 16), torch.bfloat16),
            ((2, 8, 64), torch.float32),
            (square, torch.bool),
        ],
        key=str,
    )


def test_the_device_attention_computes_what_torchs_sdpa_computes():
    """Values and gradients of the flash model against F.scaled_dot_product_attention (grouped
    query heads, two documents in a row), float32."""
    q, k, v, mask = _inputs(dtype=torch.float32)
    grad = torch.randn(2, 8, 64, 16)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad)
    with flash.device_attention("neuron"):
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    grads = torch.autograd.grad(got, (q, k, v), grad)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for mine, theirs in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    assert F.scaled_dot_product_attention is not flash.flash_sdpa  # restored on exit


TRACE_TINY = """
import contextlib, json, sys
sys.path.insert(0, "tests")
from conftest import resolve
from qwen3_trainium.memory import flash, trace
run = resolve("model=native", "model.flavor=tiny", "device=neuron", "launcher.nproc_per_node=1", "parallel=fsdp",
              "training.seq_len=2048", "training.local_batch_size=1", "activation_checkpoint.mode=none")
if sys.argv[1] == "cpu_kernel":  # torch's CPU kernel, as the trace ran a device run before flash.py
    flash.device_attention = lambda device_type: contextlib.nullcontext()
result = trace.trace(run, sys.argv[2], trace.ceilings_for(run))
print(json.dumps({"parts": result.parts, "flops": result.step_flops, "layers": run.model.flavor}))
"""


def _tiny_trace(kernel: str, tmp_path) -> dict:
    import json
    import subprocess
    import sys

    from conftest import ROOT

    done = subprocess.run(
        [sys.executable, "-c", TRACE_TINY, kernel, str(tmp_path / kernel)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.heavy  # two traces of the tiny model in their own processes: about a minute
def test_a_neuron_trace_holds_no_float_mask_per_layer_and_counts_attention_flops(tmp_path):
    """The tiny flavor on Neuron at 2,048 tokens without checkpointing, traced with the device's
    attention and with torch's CPU kernel. Both keep a float32 log-sum-exp (torch 2.14's CPU
    kernel is a flash kernel too), but the CPU kernel turns each layer's boolean mask into a
    bfloat16 [1, 1, 2048, 2048] copy and keeps that (8 MiB), where the device model keeps the
    boolean mask the model built (4 MiB): 4 MiB less per layer. The CPU kernel has no FLOP
    formula in torch; the device model has SDPA's, at least the forward's two matmuls and the
    backward's five for every layer (4 heads of 64)."""
    from qwen3_trainium.config import flavors

    layers = len(flavors.model_spec("tiny", "varlen").model.layers)
    cpu, device = _tiny_trace("cpu_kernel", tmp_path), _tiny_trace("flash", tmp_path)
    saved = cpu["parts"]["activations"] - device["parts"]["activations"]
    assert saved == layers * 2048 * 2048 * (2 - 1)
    attention = (2 + 5) * 2 * 4 * 2048 * 2048 * 64  # matmuls x 2 FLOPs x heads x L x S x dim
    assert device["flops"] - cpu["flops"] == layers * attention


@pytest.mark.heavy  # two traces of the tiny model, 10-20 s each
def test_a_cp_layout_traces_with_the_trainers_cp_attention_and_halves_the_activations(tmp_path):
    """Tensor parallel 2 x CP 2 on Neuron (tiny, 1,024 tokens, no checkpointing), traced as the
    trainer runs it (rank/context_parallel.py's attention and mask): the trace finishes, and each
    rank holds half the row's activations plus the gathered K/V and one mask for the step (CP 1
    keeps a [1, 1, 1024, 1024] mask per layer): between a third and all of CP 1's."""
    from qwen3_trainium.memory import trace
    from qwen3_trainium.parent.preflight import system

    base = (
        "model=native",
        "model.flavor=tiny",
        "device=neuron",
        "parallel=trn2_tp4_fsdp16",
        "launcher.nproc_per_node=8",
        "parallel.tensor_parallel_degree=2",
        "training.seq_len=1024",
        "training.local_batch_size=1",
        "model.attn_backend=sdpa",
        "activation_checkpoint.mode=none",
    )
    traced = {}
    for cp in (1, 2):
        data, why = system.run_trace(
            resolve(*base, f"parallel.context_parallel_degree={cp}"), str(tmp_path / f"{cp}")
        )
        assert data is not None, why
        traced[cp] = trace.Trace(**data).parts["activations"]
    assert traced[1] / 3 < traced[2] < traced[1]
