"""The HBM estimate against the Neuron driver's peak: the rule ``make test-neuron`` applies, here so
that CPU tests exercise it with fake driver readings.

Pre-flight passes an estimate up to 90% of a rank's memory without a word, warns above and
refuses above 100% (README, "Memory before launch"). That promise holds only if what the device
really uses beyond the estimate fits in the 10% it leaves: driver peak - estimate <= 10% of the
rank's memory. An estimate above the peak is safe (pre-flight may refuse a run that would fit);
its ratio is reported, not judged.

The trace (``memory=trace``) is held to the same rule against the watched peak (torch.accelerator's
peak reserved on SDK 2.34, else the driver's): pre-flight applies the same thresholds to the traced
peak as to the estimate (90% warns, 100% refuses), so the same 10% must hold the difference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SILENT_FRACTION = 0.9  # pre-flight's warning threshold: an estimate up to here passes silently


@dataclass(frozen=True)
class Comparison:
    ok: bool
    figure: str


def estimate_from_dry_run(stdout: str) -> tuple[float, float]:
    """(estimate, capacity) in GiB per rank, from the estimate table a launch prints."""
    total = re.search(r"total per rank\s+([\d.]+) GiB", stdout)
    capacity = re.search(r"device memory per rank\s+([\d.]+) GiB", stdout)
    if total is None or capacity is None:
        raise ValueError("no memory estimate table in the launch's output")
    return float(total.group(1)), float(capacity.group(1))


def trace_from_dry_run(stdout: str) -> tuple[float, float]:
    """(traced step peak, capacity) in GiB per rank, from the table a ``memory=trace`` launch prints
    (not its ``load peak``: the smoke loads no checkpoint)."""
    start = stdout.find("device memory per rank (traced")
    table = stdout[start:] if start >= 0 else ""
    peak = re.search(r"^\s*step peak\s+([\d.]+) GiB", table, re.MULTILINE)
    capacity = re.search(r"device memory per rank\s+([\d.]+) GiB", table)
    if peak is None or capacity is None:
        raise ValueError("no traced memory table (with the rank's capacity) in the launch's output")
    return float(peak.group(1)), float(capacity.group(1))


def compare(estimate_gib: float, driver_peak_gib: float | None, capacity_gib: float) -> Comparison:
    """The estimate against the driver's peak of the same rank (GiB, the rank's physical cores
    summed), and the headroom pre-flight's silence leaves."""
    unreadable = "the driver's per-core peak (sysfs device_mem/peak) was not readable"
    return judge(("estimate", estimate_gib), ("driver peak", driver_peak_gib), capacity_gib, unreadable)


def compare_with_trace(
    traced_gib: float, watched: tuple[str, float | None], capacity_gib: float
) -> Comparison:
    """The traced step peak against the watched peak (``(its name, GiB)``) of the same rank."""
    unreadable = f"the watched peak ({watched[0]}) was not readable"
    return judge(("traced step peak", traced_gib), watched, capacity_gib, unreadable)


def judge(
    expected: tuple[str, float], used: tuple[str, float | None], capacity_gib: float, unreadable: str
) -> Comparison:
    """What the device used (``(name, GiB)``) against what pre-flight expected: over the rank's
    memory, or more than the 10% of it pre-flight leaves above its silence, fails."""
    (expected_name, expected_gib), (used_name, used_gib) = expected, used
    if not used_gib or used_gib <= 0:
        return Comparison(False, unreadable)
    headroom = (1 - SILENT_FRACTION) * capacity_gib
    under = used_gib - expected_gib
    figure = (
        f"{expected_name} {expected_gib:.3f} GiB, {used_name} {used_gib:.3f} GiB, "
        f"ratio {expected_gib / used_gib:.2f}, capacity {capacity_gib:.3f} GiB"
    )
    if used_gib > capacity_gib:
        return Comparison(False, f"{figure}: the peak is over the rank's memory")
    if under > headroom:
        return Comparison(
            False,
            f"{figure}: the device used {under:.3f} GiB more than the {expected_name}, over the "
            f"{headroom:.3f} GiB ({100 * (1 - SILENT_FRACTION):.0f}% of the rank) pre-flight leaves "
            "below its warning",
        )
    return Comparison(True, figure)
