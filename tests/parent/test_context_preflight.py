"""Pre-flight of context parallel (parent/preflight/context.py, titan.check_titan): the paths and
backends it refuses, the lengths that must divide, the seams it needs; and a CP run it passes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import resolve

from qwen3_trainium.parent import preflight
from qwen3_trainium.parent.preflight import context

CP2 = ["parallel=cpu2_cp2"]


def _problems(*overrides: str):
    return context.check_context_parallel(resolve(*overrides))


def test_model_hf_with_cp_is_refused_in_the_quick_tier_with_the_native_command():
    problems = preflight.check_static(resolve("model=hf", *CP2), "/tmp", launching=False)
    (problem,) = [p for p in problems if p.key == "parallel.context_parallel_degree"]
    assert problem.value == 2 and "flex" in problem.message
    assert "model=native" in problem.fix and "checkpoint.initial_load_in_hf=true" in problem.fix


def test_the_quick_check_imports_neither_torch_nor_torchtitan():
    code = "import sys, qwen3_trainium.parent.preflight.context; print('torch' in sys.modules, 'torchtitan' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_torchtitans_varlen_with_cp_is_refused_with_the_sdpa_fix():
    (problem,) = _problems("device=neuron", "model.attn_backend=varlen", "parallel.context_parallel_degree=2")
    assert (problem.key, problem.value) == ("model.attn_backend", "varlen")
    assert problem.fix.startswith("model.attn_backend=sdpa")


def test_memory_trace_with_our_cp_is_accepted():
    # the trace swaps in the trainer's CP attention (memory/trace.py; traced in
    # tests/memory/test_long_context_memory.py, heavy)
    assert _problems(*CP2, "memory=trace") == []


@pytest.mark.parametrize(
    ("overrides", "multiple"),
    [
        ([*CP2, "training.seq_len=250"], 4),  # head-tail: 2 x cp chunks
        (["model=nki_moe", *CP2, "training.seq_len=256"], 512),  # rope_hf: 256 rows per rank at LNC 2
        (
            [
                "device=neuron",
                "model.attn_backend=flex",
                "parallel.context_parallel_degree=2",
                "training.seq_len=384",
            ],
            256,
        ),
        (
            [
                "model.flavor=tiny_moe",
                "parallel.context_parallel_degree=2",
                "parallel.tensor_parallel_degree=4",
                "parallel.enable_sequence_parallel=false",
                "training.seq_len=260",
            ],
            8,  # the MoE token dispatcher: cp x tp
        ),
    ],
    ids=["headtail", "rope_hf", "flex", "moe"],
)
def test_seq_len_that_does_not_divide_is_refused_naming_the_multiple(overrides, multiple):
    (problem,) = _problems(*overrides)
    assert problem.key == "training.seq_len"
    assert f"multiple of {multiple} " in problem.message
    seq = resolve(*overrides).training.seq_len
    assert f"training.seq_len={(seq // multiple + 1) * multiple} " in problem.fix


def test_cp_with_our_sdpa_passes_the_full_preflight():
    problems = preflight.check(resolve(*CP2), "/tmp", launching=False)
    assert problems == [], preflight.format_problems(problems)


def test_cp_on_nki_moe_and_tiny_moe_passes_the_full_preflight():
    for overrides in (["model=nki_moe", "training.seq_len=512"], ["model.flavor=tiny_moe"]):
        problems = preflight.check(resolve(*CP2, *overrides), "/tmp", launching=False)
        assert problems == [], preflight.format_problems(problems)


def test_a_missing_cp_seam_is_named(monkeypatch):
    import torchtitan.distributed.context_parallel as titan_cp

    from qwen3_trainium.parent.preflight.titan import context_parallel_seams

    monkeypatch.delattr(titan_cp, "cp_shard")
    (problem,) = context_parallel_seams(resolve(*CP2))
    assert problem.key == "versions.torchtitan"
    assert "torchtitan.distributed.context_parallel.cp_shard is missing" in problem.message


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["eval=on"], "eval.sample_tokens"),
        (["eval.long_context=true"], "eval.long_context"),
        (["checkpoint=hf_export"], "checkpoint.export_check"),
    ],
)
def test_whole_sequence_forwards_are_refused_with_cp_each_with_its_switch(overrides, key):
    problems = _problems(*CP2, *overrides)
    assert key in [p.key for p in problems]
    (problem,) = [p for p in problems if p.key == key]
    assert problem.fix.startswith(f"{key}=")


def test_held_out_validation_without_samples_passes_with_cp():
    assert _problems(*CP2, "eval=on", "eval.sample_tokens=0") == []
