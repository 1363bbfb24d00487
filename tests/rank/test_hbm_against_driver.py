"""The rule ``make test-neuron`` judges the HBM estimate and the trace by, run on CPU with fake driver
readings: a sysfs tree as the Neuron driver lays it out, read by the ranks' own reader
(``hbm_watch.py``), and an estimate table and a traced table as pre-flight prints them."""

from __future__ import annotations

import pytest

from qwen3_trainium.memory import estimate
from qwen3_trainium.memory.trace import Trace
from qwen3_trainium.parent.preflight.system import trace_table
from qwen3_trainium.rank import hbm_watch
from tests.support import hbm_against_driver as hbm

GiB = 2**30
PEAK = "memory/neuron_driver_peak(GiB)"


def _driver(root, peaks_gib: dict[tuple[int, int], float]) -> None:
    """``neuron{chip}/neuron_core{core}/stats/memory_usage/device_mem/{total,peak}`` in bytes."""
    for (chip, core), peak in peaks_gib.items():
        folder = root / f"neuron{chip}" / f"neuron_core{core}" / "stats" / "memory_usage" / "device_mem"
        folder.mkdir(parents=True)
        (folder / "total").write_text(f"{int(12 * GiB)}\n")
        (folder / "peak").write_text(f"{int(peak * GiB)}\n")


def _printed_estimate() -> tuple[float, float]:
    """2.104 GiB per rank of a 23.8125 GiB rank (LNC=2), as the launch prints it."""
    table = estimate.Estimate(
        {"parameters": int(1.5 * GiB), "activations": int(0.604 * GiB)}, int(23.8125 * GiB)
    )
    return hbm.estimate_from_dry_run("[qwen3-trainium] device memory per rank (estimate)\n" + table.table())


def test_the_printed_estimate_and_capacity_are_read_back():
    assert _printed_estimate() == (2.104, 23.812)
    with pytest.raises(ValueError):
        hbm.estimate_from_dry_run("no table here")


@pytest.mark.parametrize(
    "core_peaks, ok, words",
    [
        ((2.0, 2.0), True, "driver peak 4.000 GiB, ratio 0.53"),  # 1.896 GiB over the estimate: < 2.381
        ((0.5, 0.5), True, "ratio 2.10"),  # an over-estimate is safe, reported
        ((2.3, 2.3), False, "2.496 GiB more than the estimate, over the 2.381 GiB"),
        ((12.0, 12.0), False, "the peak is over the rank's memory"),
    ],
)
def test_rank_1_at_lnc_2_reads_its_two_cores_and_is_judged(tmp_path, core_peaks, ok, words):
    """Rank 1 at LNC=2 is chip 0's physical cores 2 and 3; rank 0's cores hold 11 GiB each, which
    would fail every case if they were read instead."""
    _driver(tmp_path, {(0, 0): 11.0, (0, 1): 11.0, (0, 2): core_peaks[0], (0, 3): core_peaks[1]})
    reading = hbm_watch.neuron_driver_memory(local_rank=1, lnc=2, root=str(tmp_path))
    assert reading is not None and reading[PEAK] == pytest.approx(sum(core_peaks))
    verdict = hbm.compare(*_with_peak(reading[PEAK]))
    assert verdict.ok is ok and words in verdict.figure, verdict.figure


def _with_peak(peak: float) -> tuple[float, float, float]:
    estimate_gib, capacity_gib = _printed_estimate()
    return estimate_gib, peak, capacity_gib


def test_an_unreadable_driver_fails_the_comparison(tmp_path):
    _driver(tmp_path, {(0, 0): 1.0})  # rank 0 at LNC=2 needs cores 0 and 1: core 1 is missing
    assert hbm_watch.neuron_driver_memory(local_rank=0, lnc=2, root=str(tmp_path)) is None
    for peak in (None, 0.0):
        verdict = hbm.compare(*_with_peak(peak))
        assert not verdict.ok and "not readable" in verdict.figure


def _printed_trace(load_gib: float = 0.0) -> str:
    """A ``memory=trace`` launch's table: a 3.25 GiB step peak (2 + 1.25) of a 23.8125 GiB rank,
    under an estimate table whose figures differ, and with ``load_gib`` as its load peak."""
    parts = {"parameters (+ gathered)": 2 * GiB, "activations": int(1.25 * GiB)}
    trace = Trace(world=64, parts=parts, load_parts={"parameters": int(load_gib * GiB)} if load_gib else {})
    estimated = estimate.Estimate({"parameters": 5 * GiB}, 30 * GiB).table()
    return f"{estimated}\n[qwen3-trainium] {trace_table(trace, int(23.8125 * GiB))}\n"


@pytest.mark.parametrize("load_gib", [0.0, 7.5])
def test_the_traced_step_peak_and_capacity_are_read_back(load_gib):
    """The step peak, not the load peak (7.5 GiB) nor the estimate above it (5 GiB of 30)."""
    assert hbm.trace_from_dry_run(_printed_trace(load_gib)) == (3.25, 23.812)
    with pytest.raises(ValueError):
        hbm.trace_from_dry_run(estimate.Estimate({"parameters": GiB}, 30 * GiB).table())


@pytest.mark.parametrize(
    "watched, ok, words",
    [
        (("accelerator peak reserved", 5.0), True, "accelerator peak reserved 5.000 GiB, ratio 0.65"),
        (("driver peak", 3.0), True, "ratio 1.08"),  # the trace above the peak: safe, reported
        (
            ("accelerator peak reserved", 5.7),
            False,
            "2.450 GiB more than the traced step peak, over the 2.381",
        ),
        (("driver peak", None), False, "the watched peak (driver peak) was not readable"),
    ],
)
def test_the_watched_peak_is_judged_against_the_traced_step_peak(watched, ok, words):
    """Up to the trace plus 10% of the rank (2.381 GiB of 23.812): 3.25 + 2.381 = 5.631 GiB."""
    verdict = hbm.compare_with_trace(*_trace_and(watched))
    assert verdict.ok is ok and words in verdict.figure, verdict.figure


def _trace_and(watched: tuple[str, float | None]) -> tuple[float, tuple[str, float | None], float]:
    traced, capacity = hbm.trace_from_dry_run(_printed_trace())
    return traced, watched, capacity
