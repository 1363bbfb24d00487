"""Neuron / CUDA / CPU: which device, its facts (memory, peak FLOPs), how many processes and
their env.

Explicit opt-in: ``device.type`` comes from config; ``auto`` only fills the default
(neuron, then cuda, then cpu). What a rank on the CPU installs before torchtitan's trainer is
imported is in ``cpu_device.py``.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

GiB = 2**30


MB = 2**20


@dataclass(frozen=True)
class NeuronInstance:
    """Checked facts (STACK.md): per physical NeuronCore; a logical core (one rank) is LNC of them."""

    physical_cores: int
    hbm_per_physical_core: int  # bytes
    runtime_reserved_per_physical_core: int  # bytes the Neuron runtime keeps (micro-code)
    peak_bf16_flops_per_physical_core: float  # dense; MFU's peak (NEURONCORE_V3_BF16_FLOPS)
    peak_fp32_flops_per_physical_core: float
    hbm_bytes_per_second_per_physical_core: float

    def memory_per_rank(self, lnc: int) -> int:
        return (self.hbm_per_physical_core - self.runtime_reserved_per_physical_core) * lnc

    def peak_flops_per_rank(self, lnc: int) -> float:
        """MFU's denominator: the per-core BF16 figure times the physical cores of one rank."""
        return self.peak_bf16_flops_per_physical_core * lnc

    def roofline_per_rank(self, lnc: int) -> Roofline:
        return Roofline(
            self.peak_bf16_flops_per_physical_core * lnc,
            self.peak_fp32_flops_per_physical_core * lnc,
            self.hbm_bytes_per_second_per_physical_core * lnc,
        )


@dataclass(frozen=True)
class Roofline:
    """What one rank can do at best: the roofline's two ceilings (``roofline.py``)."""

    bf16_flops: float  # per second, also float16
    fp32_flops: float
    bytes_per_second: float  # device memory bandwidth
    op_seconds: float = 0.0  # a fixed cost per op (dispatch, launch): measured on a CPU, 0 on a device


# MFU's peak. AWS publishes two BF16 figures for Trainium2 that do not agree:
# - per core, "A NeuronCore-v3 Tensor Engine delivers ... 79 BF16/FP16/TF32 TFLOPS" (Neuron docs,
#   "NeuronCore-v3 Architecture": https://awsdocs-neuron.readthedocs-hosted.com/en/latest/
#   about-neuron/arch/neuron-hardware/neuron-core-v3.html);
# - per chip, "Eight NeuronCore-v3 that collectively deliver ... 667 BF16/FP16/TF32 TFLOPS" (Neuron
#   docs, "Trainium2 Architecture": https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/
#   arch/neuron-hardware/trainium2.html; 655 in its v2.21.0.beta edition), which is not 8 x 79 = 632.
# MFU uses the per-core 79, times the LNC (a rank is LNC physical cores): it is the figure AWS
# states for the unit a rank is made of, and torchtitan's own Neuron peak is built from it
# (tools/utils.py get_peak_flops: 79e12 x 2 for trn2), so at LNC=2 our MFU is torchtitan's. Had
# MFU used 667 / 8 = 83.4 per core, every MFU would read 632 / 667 = 0.948 of what it reads here.
NEURONCORE_V3_BF16_FLOPS = 79e12  # dense, per physical core

# trn2.48xlarge (AWS: Trainium2 architecture and trn2 instance pages, Neuron docs):
# - 16 Trainium2 chips x 8 NeuronCore-v3 = 128 physical cores; 96 GiB HBM per chip, so 12 GiB
#   per physical core: "64 ranks per instance and approximately 24 GiB of HBM per rank, before
#   runtime overhead" at LNC=2 (Neuron "Best practices for training");
# - the runtime's "micro-code overhead of 96MB per physical Neuron Core" (Neuron runtime docs),
#   subtracted from what a rank may use;
# - BF16 peak: NEURONCORE_V3_BF16_FLOPS, so 158 TFLOPS per rank at LNC=2 and 79 at LNC=1;
# - 181 FP32 TFLOPS per chip (Neuron docs, "Trainium2 Architecture": chip components; AWS gives
#   no per-core FP32 figure), an eighth of it per physical core;
# - 2.9 TB/s of HBM bandwidth per chip, 4 HBM stacks (Neuron docs, "Trainium2 Architecture Guide
#   for NKI"), shared by its 8 physical cores.
TRN2 = NeuronInstance(128, 12 * GiB, 96 * MB, NEURONCORE_V3_BF16_FLOPS, 181e12 / 8, 2.9e12 / 8)
NEURON_INSTANCES = {"trn2.48xlarge": TRN2, "trn2u.48xlarge": TRN2}


@dataclass(frozen=True)
class DeviceInfo:
    type: str  # cpu | cuda | neuron
    devices_per_node: int  # processes per node when launcher.nproc_per_node is -1
    pg_backend: str
    memory_per_rank: int | None  # bytes of device memory one rank may use (None: unknown here)
    peak_flops_per_rank: float | None  # dense BF16 peak for MFU (None: unknown, MFU is n/a)


def accelerator_present() -> bool:
    """Any trace of a Neuron or NVIDIA device: the Neuron driver's per-device sysfs tree
    (/sys/devices/virtual/neuron_device; AWS Neuron SDK 2.33, "Neuron Sysfs User Guide") or its
    /dev/neuron<N> nodes, or the NVIDIA driver's /dev/nvidia<N> nodes."""
    patterns = ("/sys/devices/virtual/neuron_device/*", "/dev/neuron[0-9]*", "/dev/nvidia[0-9]*")
    return any(glob.glob(pattern) for pattern in patterns)


def detect_device_type() -> str:
    """neuron if TorchNeuron sees a device, else cuda if CUDA does, else cpu. Without any Neuron
    or NVIDIA device node it is cpu, decided without importing torch (2 s the launcher saves)."""
    if not accelerator_present():
        return "cpu"
    import torch

    try:  # PyPI's torch-neuronx is a placeholder that raises on import
        import torch_neuronx  # noqa: F401

        if getattr(torch, "neuron", None) is not None and torch.neuron.device_count():
            return "neuron"
    except Exception:
        pass
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_info(
    device_type: str, *, lnc: int = 2, instance: str = "trn2.48xlarge", nproc: int = 1
) -> DeviceInfo:
    if device_type == "neuron":
        facts = NEURON_INSTANCES[instance]
        return DeviceInfo(
            "neuron",
            facts.physical_cores // lnc,
            "neuron",
            facts.memory_per_rank(lnc),
            facts.peak_flops_per_rank(lnc),
        )
    if device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            return DeviceInfo("cuda", 1, "nccl", None, None)
        memory = torch.cuda.get_device_properties(0).total_memory
        return DeviceInfo("cuda", torch.cuda.device_count(), "nccl", memory, None)
    return DeviceInfo("cpu", 1, "gloo", cpu_memory_per_rank(nproc), None)


# What one CPU rank holds before any model: Python with torch 2.14 and torchtitan 0.3.0's trainer
# imported (829 MiB maximum resident set, measured on this project's CPU machines:
# ``python -c "import torch, torchtitan.train"``, ``resource.getrusage``). A floor, not an estimate.
RANK_BASE_BYTES = 800 * MB


def available_memory() -> int | None:
    """Bytes the host can give new processes without swapping: ``MemAvailable`` of
    ``/proc/meminfo`` (Linux, proc(5)), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_memory_per_rank(nproc: int) -> int:
    """A CPU rank's share of the host memory available now (all of it where /proc/meminfo is
    missing), less what the rank holds before its model (``RANK_BASE_BYTES``)."""
    nproc = max(nproc, 1)
    available = available_memory()
    if available is None:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(available // nproc - RANK_BASE_BYTES, 0)


def rank_env(
    device_type: str, *, nproc_per_node: int, lnc: int = 2, compile_cache: str = "~/.cache/neuron-neff"
) -> dict[str, str]:
    """Environment every rank needs for this device (on top of the parent's)."""
    if device_type == "neuron":
        # AWS: "Neuron framework extensions set most of these on your behalf, so set them
        # explicitly only when you need a specific behavior" (Neuron runtime configuration).
        # Set: the LNC the user chose (device.lnc; the runtime default is 2 on Trainium2, and NKI
        # launches use the same value: kernels/neuron.py) and the persistent compile cache.
        # Not set: NEURON_RT_NUM_CORES, "Number of NeuronCores required by the process" (default
        # 0 = all): torchrun's one process per logical core gets its core from the framework.
        return {
            "NEURON_LOGICAL_NC_CONFIG": str(lnc),
            "TORCH_NEURONX_NEFF_CACHE_DIR": os.path.expanduser(compile_cache),
        }
    if device_type == "cpu":
        threads = max((os.cpu_count() or 1) // nproc_per_node, 1)
        return {"OMP_NUM_THREADS": str(threads)}
    return {}
