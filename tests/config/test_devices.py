"""Device detection from the probes it reads (never from what this host happens to be), the CPU
device module, and the Trainium2 figures a rank is planned and measured against."""

from __future__ import annotations

import fnmatch
import sys
import types

import pytest
import torch

from qwen3_trainium.config import cpu_device, devices

GiB, MiB = 2**30, 2**20


def test_cpu_device_module_reports_peak_rss_and_resets_it():
    mod = cpu_device.CpuDeviceModule()
    mod.reset_peak_memory_stats()  # the process's peak so far (an earlier test's, in a worker) is not this test's
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


# ---- detection, from controlled probes ---------------------------------------------------------

NEURON_SYSFS = "/sys/devices/virtual/neuron_device/neuron0"
NVIDIA_DRIVER_ONLY = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-modeset"]  # no GPU among them


def _filesystem(monkeypatch, *paths: str) -> None:
    """The device nodes and sysfs entries that exist, as far as the detection's globs can see."""
    monkeypatch.setattr(devices, "glob", types.SimpleNamespace(glob=lambda p: fnmatch.filter(paths, p)))


def _neuron_stack(monkeypatch, tmp_path, *, installed: str, neuron_devices: int = 0, cuda: bool = False):
    """torch-neuronx as ``installed``: "real" (imports, ``torch.neuron`` sees ``neuron_devices``),
    "placeholder" (PyPI's, which raises on import) or "absent"; CUDA available or not."""
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
    if installed == "real":
        monkeypatch.setitem(sys.modules, "torch_neuronx", types.ModuleType("torch_neuronx"))
        monkeypatch.setattr(
            torch, "neuron", types.SimpleNamespace(device_count=lambda: neuron_devices), raising=False
        )
    elif installed == "placeholder":
        (tmp_path / "torch_neuronx.py").write_text("raise RuntimeError('the PyPI placeholder')\n")
        monkeypatch.syspath_prepend(str(tmp_path))
    else:
        monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import raises ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)


@pytest.mark.parametrize(
    "paths, present",
    [
        ([NEURON_SYSFS], True),
        (["/dev/neuron0"], True),
        (["/dev/neuron15", "/dev/null"], True),
        (["/dev/nvidia0"], True),
        (NVIDIA_DRIVER_ONLY, False),  # the driver's control nodes exist without a GPU
        (["/dev/neuron", "/dev/null", "/sys/devices/virtual/misc"], False),
        ([], False),
    ],
)
def test_an_accelerator_is_present_only_where_a_device_node_or_the_neuron_sysfs_is(
    monkeypatch, paths, present
):
    _filesystem(monkeypatch, *paths)
    assert devices.accelerator_present() is present


def test_without_any_device_node_it_is_cpu_and_torch_is_not_imported(monkeypatch):
    _filesystem(monkeypatch, "/dev/null", *NVIDIA_DRIVER_ONLY)
    monkeypatch.setitem(sys.modules, "torch", None)  # any `import torch` now raises
    assert devices.detect_device_type() == "cpu"


@pytest.mark.parametrize(
    "paths, installed, neuron_devices, cuda, expected",
    [
        (["/dev/neuron0", NEURON_SYSFS], "real", 16, False, "neuron"),
        (["/dev/neuron0", "/dev/nvidia0"], "real", 16, True, "neuron"),  # neuron first
        (["/dev/neuron0"], "real", 0, False, "cpu"),  # TorchNeuron sees no device
        (["/dev/neuron0"], "placeholder", 0, False, "cpu"),
        (["/dev/nvidia0"], "placeholder", 0, True, "cuda"),
        (["/dev/nvidia0"], "absent", 0, True, "cuda"),
        (["/dev/nvidia0"], "absent", 0, False, "cpu"),  # a node, and CUDA cannot use it
    ],
)
def test_detection_follows_what_the_probes_say(
    monkeypatch, tmp_path, paths, installed, neuron_devices, cuda, expected
):
    _filesystem(monkeypatch, *paths)
    _neuron_stack(monkeypatch, tmp_path, installed=installed, neuron_devices=neuron_devices, cuda=cuda)
    assert devices.detect_device_type() == expected


# ---- Trainium2: the figures a rank is planned and measured against ------------------------------

# MFU's peak is AWS's per-core figure: "A NeuronCore-v3 Tensor Engine delivers ... 79 BF16/FP16/TF32
# TFLOPS" (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/
# neuron-core-v3.html), times the physical cores a rank has (its LNC). Not the chip page's 667 / 8.
PEAK_PER_RANK = {2: 158e12, 1: 79e12}
# HBM: 96 GiB per chip of 8 physical cores, less the runtime's 96 MB per physical core.
MEMORY_PER_RANK = {2: 2 * (12 * GiB - 96 * MiB), 1: 12 * GiB - 96 * MiB}


@pytest.mark.parametrize("lnc", [2, 1])
def test_a_trn2_rank_at_each_lnc_has_the_cited_peak_memory_and_count(lnc):
    info = devices.device_info("neuron", lnc=lnc, instance="trn2.48xlarge")
    assert info.peak_flops_per_rank == PEAK_PER_RANK[lnc]
    assert info.memory_per_rank == MEMORY_PER_RANK[lnc]
    assert info.devices_per_node == {2: 64, 1: 128}[lnc]  # 16 chips x 8 physical cores / LNC


def test_mfu_at_lnc_2_uses_torchtitans_own_trn2_peak(monkeypatch):
    """torchtitan's neuron branch (``get_peak_flops``) is an independent reading of the same AWS
    page; at LNC=2, AWS's default on Trainium2, the two MFU figures must be one figure."""
    from torchtitan.tools import utils

    def no_lspci(*args, **kwargs):
        raise FileNotFoundError("lspci")  # its first probe: an H100 listed there would win

    monkeypatch.setattr(utils.subprocess, "run", no_lspci)
    monkeypatch.setattr(
        utils,
        "device_module",
        types.SimpleNamespace(get_device_properties=lambda: types.SimpleNamespace(name="trn2")),
    )
    assert devices.device_info("neuron", lnc=2).peak_flops_per_rank == utils.get_peak_flops("neuron")


def test_the_trn2_roofline_per_rank_at_lnc_2():
    """The chip page's 181 FP32 TFLOPS and the NKI guide's 2.9 TB/s, over 8 physical cores, two of
    them per rank: what the README quotes (725 GB/s per rank)."""
    roof = devices.NEURON_INSTANCES["trn2.48xlarge"].roofline_per_rank(2)
    assert (roof.bf16_flops, roof.fp32_flops, roof.bytes_per_second) == (158e12, 45.25e12, 725e9)
