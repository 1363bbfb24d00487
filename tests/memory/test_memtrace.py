"""memory=trace: the real model's step traced before launch, its verdict, and the roofline."""

from __future__ import annotations

import pytest
from conftest import resolve, run_launch

from qwen3_trainium.config import devices
from qwen3_trainium.memory import trace
from qwen3_trainium.parent import preflight
from qwen3_trainium.parent.preflight import system

GiB = 2**30


def test_dry_run_traces_a_trn2_layout_at_64_ranks():
    """The issue's command, on a smaller model: the 8B flavor takes about 35 s on 2 cores."""
    proc = run_launch(
        "model=native",
        "model.flavor=debugmodel",
        "device=neuron",
        "parallel=trn2_tp4_fsdp16",
        "dry_run=true",
        "memory=trace",
        "preflight_cache=false",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "device memory per rank (traced: 2 steps as rank 0 of 64" in out
    for row in ("parameters (+ gathered)", "gradients", "optimizer states", "activations", "step peak"):
        assert row in out
    assert "device memory per rank         23.812 GiB (peak" in out
    assert "step time (roofline, communication not modelled):" in out
    assert "MFU" in out


def _trace(tmp_path, *overrides):
    run = resolve(*overrides)
    data, why = system.run_trace(run, str(tmp_path))
    assert data is not None, why
    return trace.Trace(**data)


def test_sharding_divides_parameters_and_adamw_states_exactly(tmp_path):
    """One rank holds every parameter; two FSDP ranks half of them each. AdamW's two states are
    twice the parameters, in float32, at the peak of the second step."""
    base = ("model=native", "model.flavor=tiny", "device=cpu", "training.local_batch_size=1")
    one = _trace(tmp_path / "1", *base, "launcher.nproc_per_node=1")
    two = _trace(tmp_path / "2", *base, "launcher.nproc_per_node=2")
    import torch

    from qwen3_trainium.config import flavors

    with torch.device("meta"):
        model = flavors.model_spec("tiny", "varlen").model.build()
    n_params = sum(p.numel() for p in model.parameters())
    assert one.world == 1 and two.world == 2
    states = one.parts["optimizer states"]
    assert abs(states - 2 * 4 * n_params) < 1024  # plus AdamW's step counters
    assert abs(two.parts["optimizer states"] - states / 2) < 1024
    assert one.parts["activations"] > 0 and one.peak == sum(one.parts.values())


def test_a_traced_peak_over_the_rank_memory_is_refused(tmp_path):
    run = resolve(
        "model=native",
        "model.flavor=debugmodel",
        "device=neuron",
        "device.lnc=1",
        "parallel=trn2_dp64",
        "training.local_batch_size=512",
        "memory=trace",
    )
    problems = preflight.check(run, str(tmp_path), launching=False)
    memory = [p for p in problems if p.key == "memory"]
    assert memory, preflight.format_problems(problems)
    assert "traced" in memory[0].message and "over the 11.91 GiB a rank has" in memory[0].message


def test_a_trace_that_cannot_finish_names_the_knob(tmp_path):
    run = resolve("model=native", "device=cpu", "memory=trace", "memory.timeout=1")
    problems = preflight.check(run, str(tmp_path), launching=False)
    assert [(p.key, p.value) for p in problems] == [("memory", "trace")]
    assert "memory.timeout=1" in problems[0].message
    assert not list(tmp_path.glob(system.TRACE_CONFIG))  # the helper's config is removed


@pytest.mark.heavy  # three traces, half a minute
@pytest.mark.parametrize(
    "path",
    [
        ("model=hf",),
        ("model=nki_moe",),  # the blockwise kernel's op and its backward op, on fake tensors
        ("model=nki_moe", "parallel=cpu2", "model.kernels=[]", "training.mixed_precision_param=bfloat16"),
        ("model=native", "model.flavor=tiny_moe"),  # float32 grouped experts (CPU's default)
    ],
)
def test_every_path_traces(path, tmp_path):
    trace = _trace(tmp_path, *path, "device=cpu", "smoke=on")
    assert (
        trace.parts["optimizer states"] > 0
        and trace.parts["activations"] + trace.parts["backward temporaries"] > 0
    )


def test_the_roofline_takes_the_slower_of_compute_and_memory_traffic():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from qwen3_trainium.memory.roofline import RooflineMode

    ceilings = devices.Roofline(bf16_flops=1e12, fp32_flops=1e11, bytes_per_second=1e9)
    with FakeTensorMode():
        a, b = torch.empty(256, 512), torch.empty(512, 128)
        with RooflineMode(ceilings) as mode:
            a @ b
    flops, moved = 2 * 256 * 512 * 128, 4 * (256 * 512 + 512 * 128 + 256 * 128)
    assert mode.flops == flops
    assert mode.seconds == pytest.approx(max(flops / 1e11, moved / 1e9))


def test_trn2_ceilings_and_mfu_as_torchtitan_counts_it():
    roof = devices.NEURON_INSTANCES["trn2.48xlarge"].roofline_per_rank(2)
    assert roof.bf16_flops == 158e12 and roof.fp32_flops == pytest.approx(181e12 / 4)
    assert roof.bytes_per_second == pytest.approx(2.9e12 / 4)
    traced = trace.Trace(
        world=64,
        parts={},
        step_seconds=0.5,
        model_flops_per_token=1e9,
        tokens_per_step=2048,
        non_data_parallel=4,
        peak_bf16_flops=roof.bf16_flops,
    )
    assert traced.tokens_per_second == 1024  # 2048 tokens / 0.5 s / tp 4
    assert traced.mfu == pytest.approx(1e9 * 1024 / 158e12)
