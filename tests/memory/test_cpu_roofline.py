"""``memory/cpu_roofline.py``: this CPU's ceilings, measured once (well under a second), fall in a
CPU's range, and the counting behind each (FLOPs, bytes, threads) is checked on stubbed timers."""

from __future__ import annotations

import math
import time

import pytest
import torch

from qwen3_trainium.memory import cpu_roofline


@pytest.fixture(scope="module")
def measured():
    start = time.perf_counter()
    ceilings = cpu_roofline.measure(1)
    return ceilings, time.perf_counter() - start


def test_measure_one_thread_gives_positive_finite_ceilings_in_a_cpus_range(measured):
    ceilings, _ = measured
    values = (ceilings.bf16_flops, ceilings.fp32_flops, ceilings.bytes_per_second, ceilings.op_seconds)
    assert all(math.isfinite(v) and v > 0 for v in values)
    assert 1e8 <= ceilings.fp32_flops <= 1e13  # one core: ~50 GFLOP/s with AVX2 FMA
    assert 1e8 <= ceilings.bytes_per_second <= 1e12  # DRAM: a few to a few hundred GB/s
    assert 1e-7 <= ceilings.op_seconds <= 1e-3  # Python + dispatcher: microseconds


def test_measure_takes_well_under_a_second(measured):
    assert measured[1] < 1.0


def test_matmul_counts_two_n_cubed_flops_and_add_counts_inputs_and_output(monkeypatch):
    monkeypatch.setattr(cpu_roofline, "best_seconds", lambda fn, repeats: 0.5)
    assert cpu_roofline.matmul_flops(torch.float32, 10) == 2 * 10**3 / 0.5
    assert cpu_roofline.add_bytes_per_second(4 * 1000) == 3 * 4 * 1000 / 0.5


def test_best_seconds_warms_up_once_then_keeps_the_fastest(monkeypatch):
    clock = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # timed calls of 3, 1 and 2 s
    monkeypatch.setattr(cpu_roofline.time, "perf_counter", lambda: next(clock))
    calls = []
    assert cpu_roofline.best_seconds(lambda: calls.append(1), repeats=3) == 1.0
    assert len(calls) == 4  # the warm-up is not timed


def test_measure_runs_at_the_given_threads_and_restores_torchs(monkeypatch):
    seen = []

    def record(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return 1.0

    for name in ("matmul_flops", "add_bytes_per_second", "tiny_op_seconds"):
        monkeypatch.setattr(cpu_roofline, name, record)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cpu_roofline.measure(1)
        assert seen == [1, 1, 1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_tiny_op_seconds_is_the_median_sample_over_its_ops(monkeypatch):
    clock = iter([0.0, 2.0, 10.0, 18.0, 20.0, 24.0])  # samples of 2, 8 and 4 s, 4 ops each
    monkeypatch.setattr(cpu_roofline.time, "perf_counter", lambda: next(clock))
    assert cpu_roofline.tiny_op_seconds(per_sample=4, samples=3) == 1.0
