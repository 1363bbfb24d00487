"""Neuron / CUDA / CPU: which device, how many processes, their env, and the CPU backend.

Explicit opt-in: ``device.type`` comes from config; ``auto`` only fills the default
(neuron, then cuda, then cpu). ``install_rank_device`` runs in each rank before torchtitan's
trainer is imported: on CPU it points torchtitan at a small device module that supplies the
calls ``torch.cpu`` lacks; on neuron and cuda it changes nothing.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from types import SimpleNamespace

# Physical NeuronCores per instance. Logical cores per node = physical / LNC.
NEURON_INSTANCES = {"trn2.48xlarge": 128, "trn2u.48xlarge": 128, "trn1.32xlarge": 32}


@dataclass(frozen=True)
class DeviceInfo:
    type: str  # cpu | cuda | neuron
    devices_per_node: int  # processes per node when launcher.nproc_per_node is -1
    pg_backend: str


def detect_device_type() -> str:
    """neuron if TorchNeuron sees a device, else cuda if CUDA does, else cpu."""
    import torch

    try:  # PyPI's torch-neuronx is a placeholder that raises on import
        import torch_neuronx  # noqa: F401

        if getattr(torch, "neuron", None) is not None and torch.neuron.device_count():
            return "neuron"
    except Exception:
        pass
    return "cuda" if torch.cuda.is_available() else "cpu"


def neuron_cores_per_node(instance: str, lnc: int) -> int:
    return NEURON_INSTANCES[instance] // lnc


def device_info(device_type: str, *, lnc: int = 2, instance: str = "trn2.48xlarge") -> DeviceInfo:
    if device_type == "neuron":
        return DeviceInfo("neuron", neuron_cores_per_node(instance, lnc), "neuron")
    if device_type == "cuda":
        import torch

        return DeviceInfo("cuda", max(torch.cuda.device_count(), 1), "nccl")
    return DeviceInfo("cpu", 1, "gloo")


def rank_env(device_type: str, *, nproc_per_node: int, lnc: int = 2) -> dict[str, str]:
    """Environment every rank needs for this device (on top of the parent's)."""
    if device_type == "neuron":
        return {
            "NEURON_LOGICAL_NC_CONFIG": str(lnc),
            "NEURON_RT_NUM_CORES": str(nproc_per_node),
            "TORCH_NEURONX_NEFF_CACHE_DIR": os.environ.get(
                "TORCH_NEURONX_NEFF_CACHE_DIR", os.path.expanduser("~/.cache/neuron-neff")
            ),
        }
    if device_type == "cpu":
        threads = max((os.cpu_count() or 1) // nproc_per_node, 1)
        return {"OMP_NUM_THREADS": str(threads)}
    return {}


class CpuDeviceModule:
    """The ``torch.cuda``-shaped calls torchtitan makes, answered for the CPU.

    Memory figures are the process's resident set: peak RSS (``VmHWM``), which
    ``reset_peak_memory_stats`` resets through ``/proc/self/clear_refs``.
    """

    def __getattr__(self, name: str):
        import torch

        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> int:
        return 0  # an index: torch.distributed.barrier(device_ids=[...]) builds cpu:0

    @staticmethod
    def set_device(device) -> None:
        pass

    @staticmethod
    def get_device_name(device=None) -> str:
        return f"cpu ({platform.processor() or platform.machine()})"

    @staticmethod
    def get_device_properties(device=None) -> SimpleNamespace:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return SimpleNamespace(name="cpu", total_memory=total)

    @staticmethod
    def memory_stats(device=None) -> dict[str, int]:
        peak = _proc_status_bytes("VmHWM")
        return {
            "active_bytes.all.peak": peak,
            "reserved_bytes.all.peak": peak,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:  # not Linux, or not permitted: the peak is then since start
            pass

    @staticmethod
    def empty_cache() -> None:
        pass


def _proc_status_bytes(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def gloo_safe_parallelize(parallelize_fn):
    """Wrap a model spec's ``parallelize_fn`` so FSDP reduces with plain sums (CPU only).

    FSDP2 divides gradients with ``ReduceOp.PREMUL_SUM``, which gloo rejects; forcing sum
    reduction keeps the same average (FSDP divides separately) and works on gloo.
    """

    @functools.wraps(parallelize_fn)
    def parallelize(model, **kwargs):
        from torch.distributed.fsdp import FSDPModule

        model = parallelize_fn(model, **kwargs)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
        return model

    return parallelize


def install_rank_device(device_type: str) -> None:
    """Point torchtitan at the configured device. Must run before torchtitan.trainer."""
    if device_type != "cpu":
        return  # neuron and cuda: torchtitan's own detection is right
    from torchtitan.tools import utils

    utils.device_type = "cpu"
    utils.device_module = CpuDeviceModule()
