"""The HBM estimate against the Neuron driver's peak: the rule ``make test-neuron`` applies, here so
that CPU tests exercise it with fake driver readings.

Pre-flight passes an estimate up to 90% of a rank's memory without a word, warns above and
refuses above 100% (README, "Memory before launch"). That promise holds only if what the device
really uses beyond the estimate fits in the 10% it leaves: driver peak - estimate <= 10% of the
rank's memory. An estimate above the peak is safe (pre-flight may refuse a run that would fit);
its ratio is reported, not judged.
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


def compare(estimate_gib: float, driver_peak_gib: float | None, capacity_gib: float) -> Comparison:
    """The estimate against the driver's peak of the same rank (GiB, the rank's physical cores
    summed), and the headroom pre-flight's silence leaves."""
    if not driver_peak_gib or driver_peak_gib <= 0:
        return Comparison(False, "the driver's per-core peak (sysfs device_mem/peak) was not readable")
    headroom = (1 - SILENT_FRACTION) * capacity_gib
    under = driver_peak_gib - estimate_gib
    figure = (
        f"estimate {estimate_gib:.3f} GiB, driver peak {driver_peak_gib:.3f} GiB, "
        f"ratio {estimate_gib / driver_peak_gib:.2f}, capacity {capacity_gib:.3f} GiB"
    )
    if driver_peak_gib > capacity_gib:
        return Comparison(False, f"{figure}: the peak is over the rank's memory")
    if under > headroom:
        return Comparison(
            False,
            f"{figure}: the device used {under:.3f} GiB more than estimated, over the {headroom:.3f} GiB "
            f"({100 * (1 - SILENT_FRACTION):.0f}% of the rank) pre-flight leaves below its warning",
        )
    return Comparison(True, figure)
