"""memory=trace: the real model's step traced before launch, its verdict, and the roofline."""

from __future__ import annotations

import pytest
from conftest import resolve, run_launch

from qwen3_trainium.config import devices
from qwen3_trainium.memory import trace
from qwen3_trainium.parent import preflight
from qwen3_trainium.parent.preflight import system

GiB = 2**30


@pytest.mark.heavy  # 25 s; tests/test_docs_commands.py dry-runs the trn2 lines in make test
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
    assert "device memory per rank (traced: the second step as rank 0 of 64" in out
    for row in ("parameters (+ gathered)", "gradients", "optimizer states", "activations", "step peak"):
        assert row in out
    assert "device memory per rank         23.812 GiB (peak" in out
    assert "step time (roofline, communication not modelled):" in out
    assert "% of 158 BF16 TFLOPS per rank" in out  # trn2 at LNC=2: 2 x 79 (config/devices.py)


def _trace(tmp_path, *overrides):
    run = resolve(*overrides)
    data, why = system.run_trace(run, str(tmp_path))
    assert data is not None, why
    return trace.Trace(**data)


def test_the_primed_step_is_the_two_step_traces_second_step(tmp_path):
    """The trace primes AdamW's states (gradients of zeros, one optimizer step) instead of tracing
    step 1's forward and backward. Against the two-step trace (``--first-step``), on one model,
    both traced at once: every part equal to the byte but the activations, which are lower by
    exactly one micro-batch's hidden state. torch's tracker keeps step 1's chunked-loss input
    alive into step 2 (torchtitan's ``ChunkedLossWrapper`` chunks are views of it); without the
    tracker nothing holds it, so the two-step trace counted it twice. The roofline prices the
    same FLOPs, and the step time within 0.1 %."""
    import json
    import subprocess
    import sys

    from qwen3_trainium.parent import compose

    run = resolve("model=native", "model.flavor=tiny", "device=cpu", "training.local_batch_size=2")
    path = compose.save(run, str(tmp_path), "trace.yaml")
    command = [
        sys.executable,
        "-m",
        "qwen3_trainium.memory.trace",
        str(tmp_path),
        path,
        "--ceilings",
        "1e12,1e11,1e11,1e-6",
    ]
    procs = [
        subprocess.Popen(command + extra, stdout=subprocess.PIPE, text=True)
        for extra in ([], ["--first-step"])
    ]
    primed, two = (
        trace.Trace(**json.loads(proc.communicate(timeout=300)[0].splitlines()[-1])) for proc in procs
    )
    hidden = 2 * run.training.seq_len * 256 * 4  # local batch x seq x tiny's dim x float32
    assert {k: v for k, v in two.parts.items() if k != "activations"} == {
        k: v for k, v in primed.parts.items() if k != "activations"
    }
    assert two.parts["activations"] - primed.parts["activations"] == hidden
    assert primed.parts["optimizer states"] > 0 and primed.step_flops == two.step_flops > 0
    assert primed.step_seconds == pytest.approx(two.step_seconds, rel=1e-3)


@pytest.mark.heavy  # 20-30 s: moved out of make test to keep it near 20 minutes
def test_sharding_divides_parameters_and_adamw_states_exactly(tmp_path):
    """One rank holds every parameter; two FSDP ranks half of them each. AdamW's two states are
    twice the parameters, in float32, at the peak of the (second) step."""
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


PATHS = {
    "hf": ("model=hf",),
    "nki_moe": ("model=nki_moe",),  # the blockwise kernel's op and its backward op, on fake tensors
    "nki_moe fsdp2 bf16": (
        "model=nki_moe",
        "parallel=cpu2",
        "model.kernels=[]",
        "training.mixed_precision_param=bfloat16",
    ),
    "native tiny_moe": ("model=native", "model.flavor=tiny_moe"),  # float32 grouped experts
}
HF_SHAPE = {"hf": "dense", "nki_moe": "moe", "nki_moe fsdp2 bf16": "moe", "native tiny_moe": "moe"}
STEP_COUNTERS = 1024  # AdamW's one 4-byte step per parameter tensor: tens of tensors here


@pytest.fixture(scope="module")
def path_traces(tmp_path_factory):
    cache: dict[str, trace.Trace] = {}

    def get(name: str) -> trace.Trace:
        if name not in cache:
            cache[name] = _trace(tmp_path_factory.mktemp("trace"), *PATHS[name], "device=cpu", "smoke=on")
        return cache[name]

    return get


def _hf_parameters(shape: str) -> int:
    """Parameters of the Transformers model of the same shape (the embedded tiny assets): counted
    by Transformers, not by the tracer or our model code."""
    import torch
    import transformers

    from qwen3_trainium.data import assets

    directory = assets.ensure_hf_model() if shape == "dense" else assets.ensure_hf_moe_model()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(directory)
        )
    return sum(p.numel() for p in model.parameters())


@pytest.mark.heavy  # four traces, a minute
@pytest.mark.parametrize("name", list(PATHS))
def test_every_path_traces_its_weights_and_adamw_states_at_the_step_peak(name, path_traces):
    """At the second step's peak a rank holds at least its float32 shard of the weights and
    exactly AdamW's two float32 states per parameter (plus the step counters)."""
    traced = path_traces(name)
    per_rank = _hf_parameters(HF_SHAPE[name]) / traced.world
    assert traced.world == (2 if "fsdp2" in name else 1)
    assert 0 <= traced.parts["optimizer states"] - 8 * per_rank <= STEP_COUNTERS
    assert traced.parts["parameters (+ gathered)"] >= 4 * per_rank
    assert traced.parts["activations"] + traced.parts["backward temporaries"] > 0
    assert traced.peak == sum(traced.parts.values()) >= 12 * per_rank


@pytest.mark.heavy
def test_the_kernels_change_no_weight_bytes_and_fsdp_halves_the_adamw_states(path_traces):
    """The blockwise kernels compute the same model: the nki_moe path holds what the native path
    holds on the same flavor. Two FSDP ranks hold half the AdamW states each."""
    kernels, native, two = (path_traces(n) for n in ("nki_moe", "native tiny_moe", "nki_moe fsdp2 bf16"))
    weights = "parameters (+ gathered)"
    assert abs(kernels.parts[weights] - native.parts[weights]) <= STEP_COUNTERS
    states = kernels.parts["optimizer states"]
    assert abs(states - native.parts["optimizer states"]) <= STEP_COUNTERS
    assert abs(two.parts["optimizer states"] - states / 2) <= STEP_COUNTERS


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


def test_the_traced_tokens_per_second_and_mfu_count_as_torchtitan_does():
    """torchtitan's metrics: tokens/s per rank = tokens / seconds / (tp x pp x cp), MFU = FLOPs per
    token x tokens/s / peak. By hand: 2048 tokens in 0.5 s over tp 4 = 1024; 1e9 x 1024 / 1e14."""
    traced = trace.Trace(
        world=64,
        parts={},
        step_seconds=0.5,
        model_flops_per_token=1e9,
        tokens_per_step=2048,
        non_data_parallel=4,
        peak_bf16_flops=1e14,
    )
    assert traced.tokens_per_second == 1024
    assert traced.mfu == pytest.approx(0.01024)
    assert (
        trace.Trace(1, {}, step_seconds=1, model_flops_per_token=1e9, tokens_per_step=8).mfu == 0
    )  # no peak


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "offs"),
    [
        ((96, 64), (3, 64, 32), [10, 40, 96]),  # forward: tokens x (experts, K, N)
        ((64, 96), (96, 32), [10, 40, 96]),  # weight gradient: groups split the contracted dim
    ],
)
def test_grouped_mm_flops_are_the_sum_of_each_groups_matmul(a_shape, b_shape, offs):
    """The oracle: each group's own matmul, counted by torch's flop counter."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from qwen3_trainium.memory.roofline import RooflineMode, grouped_mm_flops

    a, b = torch.randn(*a_shape), torch.randn(*b_shape)
    out = torch._grouped_mm(a, b, offs=torch.tensor(offs, dtype=torch.int32))
    starts = [0, *offs[:-1]]
    with FlopCounterMode(display=False) as counter:
        for g, (lo, hi) in enumerate(zip(starts, offs, strict=True)):
            if b.dim() == 3:
                a[lo:hi] @ b[g]
            else:
                a[:, lo:hi] @ b[lo:hi]
    assert grouped_mm_flops(a, out) == counter.get_total_flops()
    ceilings = devices.Roofline(bf16_flops=1e12, fp32_flops=1e11, bytes_per_second=1e15)
    with RooflineMode(ceilings) as mode:
        torch._grouped_mm(a, b, offs=torch.tensor(offs, dtype=torch.int32))
    assert mode.flops == counter.get_total_flops()


def test_reading_a_tensors_device_or_allocating_costs_no_time():
    """``prim.device`` has a whole tensor as input and moves none of it; ``empty`` only allocates."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from qwen3_trainium.memory.roofline import RooflineMode

    ceilings = devices.Roofline(bf16_flops=1e12, fp32_flops=1e11, bytes_per_second=1e9)
    with FakeTensorMode():
        big = torch.empty(4096, 4096)
        with RooflineMode(ceilings) as mode:
            for _ in range(3):
                torch.ops.prim.device(big)
            torch.empty(4096, 4096)
            torch.empty_like(big)
    assert mode.seconds == 0.0
