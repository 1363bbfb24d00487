"""The CPU device module."""

from __future__ import annotations

import torch

from qwen3_trainium.config import devices


def test_cpu_device_module_reports_peak_rss_and_resets_it():
    mod = devices.CpuDeviceModule()
    before = mod.memory_stats()["active_bytes.all.peak"]
    blob = torch.ones(64 * 1024 * 1024, dtype=torch.uint8)  # 64 MiB touched
    blob.add_(1)
    peak = mod.memory_stats()["active_bytes.all.peak"]
    assert peak >= before + 32 * 2**20
    del blob
    mod.reset_peak_memory_stats()
    assert mod.memory_stats()["active_bytes.all.peak"] < peak
    assert mod.current_device() == 0
    assert mod.get_device_properties().total_memory > 2**30
    assert mod.device_count() == 1  # falls through to torch.cpu


def test_detect_device_here_is_cpu():
    assert devices.detect_device_type() == "cpu"
