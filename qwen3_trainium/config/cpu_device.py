"""The rank side of a CPU device: what torchtitan needs of a device module, for the CPU.

torchtitan binds ``device_type`` / ``device_module`` at import
(``torchtitan.tools.utils``: ``_get_available_device_type() or "cuda"``) and calls
``torch.cuda``-shaped functions that ``torch.cpu`` lacks (``get_device_name``,
``get_device_properties``, ``memory_stats``, ``reset_peak_memory_stats``, ``empty_cache``).
``install_rank_device`` points torchtitan at ``CpuDeviceModule`` before its trainer is imported;
``gloo_safe_parallelize`` makes FSDP's reductions ones gloo accepts. Neuron and CUDA need neither.
"""

from __future__ import annotations

import functools
import os
import platform
from types import SimpleNamespace


class CpuDeviceModule:
    """The ``torch.cuda``-shaped calls torchtitan makes, answered for the CPU.

    Device memory on CPU is what training adds to the process: the peak resident set (``VmHWM``)
    minus the resident set when torchtitan first resets the peak (after the model is defined on
    the meta device, before it is materialised). ``reset_peak_memory_stats`` resets the peak
    through ``/proc/self/clear_refs``.
    """

    def __init__(self) -> None:
        self.baseline: int | None = None

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

    def memory_stats(self, device=None) -> dict[str, int]:
        peak = max(_proc_status_bytes("VmHWM") - (self.baseline or 0), 0)
        return {
            "active_bytes.all.peak": peak,
            "reserved_bytes.all.peak": peak,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }

    def reset_peak_memory_stats(self, device=None) -> None:
        if self.baseline is None:
            self.baseline = _proc_status_bytes("VmRSS")
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
