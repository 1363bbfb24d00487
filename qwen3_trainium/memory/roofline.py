"""Step time before launch: torch's roofline, on the planned device's ceilings.

torch's ``RuntimeEstimator`` (``torch/distributed/_tools/runtime_estimator.py``, mode
``operator-level-cost-model``) times each aten op of a step run under ``FakeTensorMode`` as
``max(compute, transfer)``: its FLOPs (``torch.utils.flop_counter.flop_registry``) over the peak,
and the bytes it reads and writes (``torch.utils._runtime_estimation.get_num_bytes``) over the
memory bandwidth. It takes both ceilings from a CUDA device or a CUDA datasheet, and refuses to run
without an accelerator (``torch.accelerator.is_available()``). This mode applies the same model with
the ceilings of the device table (``devices.Roofline``: a trn2 rank, or a CPU measured by the
bench), and, like ``RuntimeEstimator``, leaves communication out: on the fake process group a
collective costs nothing, so the time is what the rank computes and moves, with perfect overlap.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils._runtime_estimation import _IGNORE_OPS, get_num_bytes
from torch.utils.flop_counter import flop_registry

from qwen3_trainium.config.devices import Roofline

_HALF = (torch.bfloat16, torch.float16)


class RooflineMode(TorchDispatchMode):
    """Sums the roofline time (seconds) and the FLOPs of the ops it sees."""

    def __init__(self, ceilings: Roofline, skip=lambda: False) -> None:
        super().__init__()
        self.ceilings, self.skip = ceilings, skip
        self.seconds = 0.0
        self.flops = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented  # DTensor first: this mode then sees the rank's local ops
        out = func(*args, **(kwargs or {}))
        packet = func._overloadpacket
        if self.skip() or packet in _IGNORE_OPS or func.namespace in ("c10d", "_c10d_functional"):
            return out
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        moved = sum(get_num_bytes(t) for t in inputs + outputs)
        seconds = moved / self.ceilings.bytes_per_second
        if packet in flop_registry and outputs:
            flops = flop_registry[packet](*args, **(kwargs or {}), out_val=out)
            half = outputs[0].dtype in _HALF
            peak = self.ceilings.bf16_flops if half else self.ceilings.fp32_flops
            self.flops += flops
            seconds = max(seconds, flops / peak)
        self.seconds += seconds
        return out
