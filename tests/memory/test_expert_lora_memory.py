"""LoRA on the routed experts in the memory estimate: the adapters the model shape finds, what
each route adds to the activations (hand-computed bytes), and the estimate against the trace."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import resolve

from qwen3_trainium.memory import estimate
from tests.support.published_shapes import QWEN3_30B_A3B

GiB = 2**30
ALL_LINEARS = "peft.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
# Qwen3-30B-A3B's shape (Hub config.json: 48 layers, hidden 2048, 128 experts, top 8 of width 768),
# written out by hand, with rank-8 adapters on both expert projections
WITH_EXPERTS = dataclasses.replace(QWEN3_30B_A3B, expert_adapters=(("down", 8), ("gate_up", 8)))


def _neuron(*overrides: str):
    return resolve(
        "model.flavor=30B-A3B",
        "device=neuron",
        "parallel=trn2_dp64",
        "peft=lora",
        "training.seq_len=4096",
        "training.local_batch_size=1",
        *overrides,
    )


def _parts(shape, *overrides: str) -> dict[str, int]:
    return estimate.estimate(_neuron(*overrides), shape, dp_shard=64, capacity=None).parts


@pytest.mark.slow  # builds 30B-A3B on the meta device: 5-15 s
def test_the_30b_a3b_expert_adapters_are_314_572_800_parameters_at_rank_8():
    """Per layer and expert, rank 8: gate_up A 8 x 2048 and B 1536 x 8, down A 8 x 768 and B
    2048 x 8, i.e. 51,200; x 128 experts x 48 layers = 314,572,800, beside the attention's
    5,111,808 (docs/lora.md). The shape names both adapted projections with their rank."""
    import tempfile

    import torch

    from qwen3_trainium.parent.preflight.titan import check_titan

    run = _neuron("model=native", ALL_LINEARS)
    problems, trial = check_titan(run, tempfile.mkdtemp())
    assert not problems
    with torch.device("meta"):
        model = trial.model_spec.model.build()
    shape = estimate.model_shape(trial.model_spec.model, model)
    per_expert = 8 * 2048 + 1536 * 8 + 8 * 768 + 2048 * 8
    assert per_expert * 128 * 48 == 314_572_800
    assert shape.trainable == 314_572_800 + 5_111_808
    assert shape.expert_adapters == (("down", 8), ("gate_up", 8))


@pytest.mark.parametrize(("ac", "layers"), [("none", 48), ("selective", 1), ("full", 1)])
def test_the_grouped_route_saves_a_rank_wide_row_per_adapted_projection_and_routed_copy(ac, layers):
    """model=native: each adapted projection's second grouped GEMM saves its [4096 x 8, 8] input
    in bfloat16. Without checkpointing in all 48 layers; with it (torch._grouped_mm is recomputed
    under selective too) in the layer being recomputed."""
    overrides = ("model=native", f"activation_checkpoint.mode={ac}")
    grown = _parts(WITH_EXPERTS, *overrides)["activations"] - _parts(QWEN3_30B_A3B, *overrides)["activations"]
    assert grown == layers * 4096 * 8 * (8 + 8) * 2
    assert "expert LoRA merged" not in _parts(WITH_EXPERTS, *overrides)


def test_the_grouped_route_holds_its_low_rank_gradients_in_the_layer_in_backward():
    """model=native, 4096 tokens x top 8 routed rows, bfloat16: gate_up's [R, 2 x 768] output
    gradient, down's [R, 2048] with its [R, 768] share of SwiGLU's gradient (0.27 GiB; per part
    when one is adapted)."""
    parts = _parts(WITH_EXPERTS, "model=native")
    rows = 4096 * 8
    assert parts["expert LoRA gradients"] == rows * (2 * 768 + 2048 + 768) * 2
    only_gate_up = dataclasses.replace(QWEN3_30B_A3B, expert_adapters=(("gate_up", 8),))
    assert _parts(only_gate_up, "model=native")["expert LoRA gradients"] == rows * 2 * 768 * 2
    assert "expert LoRA gradients" not in _parts(QWEN3_30B_A3B, "model=native")


def test_the_blockwise_route_holds_one_layers_merged_experts_and_their_gradient():
    """model=nki_moe: the kernel runs on W + s B A, merged again in backward: 128 experts x
    (gate_up 2048 x 1536 + down 768 x 2048) in bfloat16, twice (the weights and their gradient),
    2.25 GiB; only the adapted parts are merged."""
    parts = _parts(WITH_EXPERTS, "model=nki_moe")
    assert parts["expert LoRA merged"] == 2 * 128 * (2048 * 1536 + 768 * 2048) * 2 == 2.25 * GiB
    assert "expert LoRA gradients" not in parts
    only_down = dataclasses.replace(QWEN3_30B_A3B, expert_adapters=(("down", 8),))
    assert _parts(only_down, "model=nki_moe")["expert LoRA merged"] == 2 * 128 * 768 * 2048 * 2


@pytest.mark.heavy  # two traces of tiny_moe at 8 ranks: 30-60 s each on 2 cores
@pytest.mark.parametrize("path", ["model=native", "model=nki_moe"])
def test_the_estimate_is_within_15_percent_of_the_trace_with_expert_lora(path, tmp_path):
    """tiny_moe with rank-8 adapters on every linear and both expert projections, on a device
    layout (8 ranks, FSDP): the estimate against the peak the trace finds in the real step, the
    band the docs' trn2 lines are held to. Without the expert terms the grouped route's estimate
    reads 0.83 of the trace (the low-rank paths' gradients in backward)."""
    from qwen3_trainium.memory import trace
    from qwen3_trainium.parent.preflight import system
    from qwen3_trainium.parent.preflight.titan import check_titan

    run = resolve(
        path,
        "model.flavor=tiny_moe",
        "device=neuron",
        "parallel=trn2_dp64",
        "launcher.nproc_per_node=8",
        "peft=lora",
        ALL_LINEARS,
    )
    problems, trial = check_titan(run, str(tmp_path))
    assert not problems
    import torch

    with torch.device("meta"):
        model = trial.model_spec.model.build()
    shape = estimate.model_shape(trial.model_spec.model, model)
    assert shape.expert_adapters == (("down", 8), ("gate_up", 8))
    planned = estimate.estimate(run, shape, dp_shard=8, capacity=None)
    data, why = system.run_trace(run, str(tmp_path))
    assert data is not None, why
    traced = trace.Trace(**data)
    print(f"{path}: estimate {planned.total / GiB:.4f} GiB, trace {traced.peak / GiB:.4f} GiB")
    assert abs(planned.total / traced.peak - 1) <= 0.15, planned.table()
