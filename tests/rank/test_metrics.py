"""The metrics file, the Neuron driver's memory counters and the HBM watch (fake torch.accelerator,
torch.neuron and sysfs: the real ones exist only on a trn2)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from qwen3_trainium.rank import hbm_watch
from qwen3_trainium.rank.metrics import JsonlLogger

GiB = 2**30


def test_jsonl_logger_writes_one_row_per_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = JsonlLogger(str(path), report_mfu=False)
    log.log({"loss_metrics/global_avg_loss": 2.5, "throughput(tps)": 100.0, "mfu(%)": 1.0}, step=1)
    log.log({"loss_metrics/global_avg_loss": 2.0, "grad_norm": 1.0}, step=2)
    log.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["loss"] == 2.5 and rows[0]["tokens_per_second"] == 100.0
    assert "mfu_pct" not in rows[0]


def test_neuron_driver_memory_reads_the_ranks_physical_cores(tmp_path):
    from qwen3_trainium.rank.hbm_watch import neuron_driver_memory

    for chip, core, total, peak in ((0, 2, 3 * 2**30, 2**30), (0, 3, 2**30, 2**30)):
        base = tmp_path / f"neuron{chip}" / f"neuron_core{core}" / "stats" / "memory_usage" / "device_mem"
        base.mkdir(parents=True)
        (base / "total").write_text(f"{total}\n")
        (base / "peak").write_text(f"{peak}\n")
    got = neuron_driver_memory(local_rank=1, lnc=2, root=str(tmp_path))  # logical core 1 = physical 2, 3
    assert got == {"memory/neuron_driver_total(GiB)": 4.0, "memory/neuron_driver_peak(GiB)": 2.0}
    assert neuron_driver_memory(local_rank=0, lnc=2, root=str(tmp_path)) is None  # not readable: skipped


class FakeNeuronAllocator:
    """torch.neuron and torch.accelerator over an asynchronous allocator: its peaks (``allocated``,
    ``reserved`` GiB) show only once ``synchronize`` ran; before, the stale 0.5 GiB each."""

    def __init__(self, allocated: float, reserved: float, device: str | None = "neuron", fails: str = ""):
        self.peaks, self.device, self.fails = (allocated, reserved), device, fails
        self.synchronized = False
        self.neuron = SimpleNamespace(synchronize=self._synchronize)

    def _synchronize(self) -> None:
        self.synchronized = True

    def current_accelerator(self, check_available: bool = False):
        return None if self.device is None else SimpleNamespace(type=self.device)

    def max_memory_allocated(self, device_index=None) -> int:
        if self.fails:
            raise RuntimeError(self.fails)
        return int((self.peaks[0] if self.synchronized else 0.5) * GiB)

    def max_memory_reserved(self, device_index=None) -> int:
        return int((self.peaks[1] if self.synchronized else 0.5) * GiB)


def _driver(root, peak_gib: float) -> str:
    """Rank 1 at LNC=2: physical cores 2 and 3 of chip 0, ``peak_gib`` in all, 12 GiB each in total."""
    for core in (2, 3):
        folder = root / "neuron0" / f"neuron_core{core}" / "stats" / "memory_usage" / "device_mem"
        folder.mkdir(parents=True)
        (folder / "total").write_text(f"{12 * GiB}\n")
        (folder / "peak").write_text(f"{int(peak_gib / 2 * GiB)}\n")
    return str(root)


def _watch(root: str, fake) -> tuple[dict[str, float], str]:
    return hbm_watch.hbm_watch(1, 2, accelerator=fake, neuron=getattr(fake, "neuron", None), root=root)


def test_the_accelerator_peak_is_watched_where_torch_accelerator_reads_neuron(tmp_path):
    """SDK 2.34: the allocator's peak reserved is watched, read after torch.neuron.synchronize()
    (before it the fake shows 0.5 GiB); the driver's figures are kept beside it."""
    got, why = _watch(_driver(tmp_path, 4.0), FakeNeuronAllocator(allocated=3.0, reserved=3.5))
    assert why == ""
    assert got == {
        "memory/neuron_driver_total(GiB)": 24.0,
        "memory/neuron_driver_peak(GiB)": 4.0,
        "memory/accelerator_peak_allocated(GiB)": 3.0,
        "memory/accelerator_peak_reserved(GiB)": 3.5,
        "memory/watched_peak(GiB)": 3.5,
        "memory/watched_from_accelerator": 1.0,
    }
    assert "torch.accelerator's peak reserved" in hbm_watch.source_line(got, why)


@pytest.mark.parametrize(
    "fake, why",
    [
        (SimpleNamespace(), "AttributeError"),  # no memory functions
        (FakeNeuronAllocator(3.0, 3.5, fails="allocator not registered"), "allocator not registered"),
        (FakeNeuronAllocator(0.0, 0.0), "read 0 bytes allocated"),  # SDK 2.33: no stats, peaks 0
        (FakeNeuronAllocator(3.0, 3.5, device=None), "no available device"),
        (FakeNeuronAllocator(3.0, 3.5, device="cuda"), "is cuda, not neuron"),
    ],
)
def test_the_drivers_peak_is_watched_where_torch_accelerator_is_absent_or_fails(tmp_path, fake, why):
    got, reason = _watch(_driver(tmp_path, 4.0), fake)
    assert why in reason
    assert got == {
        "memory/neuron_driver_total(GiB)": 24.0,
        "memory/neuron_driver_peak(GiB)": 4.0,
        "memory/watched_peak(GiB)": 4.0,
        "memory/watched_from_accelerator": 0.0,
    }
    assert "the Neuron driver's sysfs peak" in hbm_watch.source_line(got, reason)


def test_nothing_is_watched_where_neither_is_readable_and_the_step_goes_on(tmp_path):
    fake = FakeNeuronAllocator(3.0, 3.5, fails="device lost")
    got, why = _watch(str(tmp_path), fake)  # an empty sysfs tree
    assert got == {} and "device lost" in why
    assert hbm_watch.source_line(got, why).startswith("nothing readable")


def test_this_hosts_torch_has_no_neuron_accelerator_and_reads_nothing():
    """The real torch.accelerator here (a CUDA build, no GPU; no torch.neuron): not used. On a trn2
    the on-device test reads it instead (``test_on_device.py``)."""
    import torch

    if getattr(torch.accelerator.current_accelerator(check_available=True), "type", "") == "neuron":
        pytest.skip("torch.accelerator is a Neuron device here: make test-neuron covers it")
    peaks, why = hbm_watch.accelerator_peak_memory()
    assert peaks is None and why


def test_the_watch_reaches_metrics_jsonl(tmp_path):
    got, _ = _watch(_driver(tmp_path, 4.0), FakeNeuronAllocator(allocated=3.0, reserved=3.5))
    log = JsonlLogger(str(tmp_path / "metrics.jsonl"), report_mfu=False)
    log.log(got, step=1)
    log.close()
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert {k: v for k, v in row.items() if k not in ("step", "time")} == {
        "neuron_driver_total_gib": 24.0,
        "neuron_driver_peak_gib": 4.0,
        "accelerator_peak_allocated_gib": 3.0,
        "accelerator_peak_reserved_gib": 3.5,
        "watched_peak_gib": 3.5,
        "watched_from_accelerator": 1.0,
    }
