"""Step time before launch: torch's roofline, on the planned device's ceilings.

torch's ``RuntimeEstimator`` (``torch/distributed/_tools/runtime_estimator.py``, mode
``operator-level-cost-model``) times each aten op of a step run under ``FakeTensorMode`` as
``max(compute, transfer)``: its FLOPs (``torch.utils.flop_counter.flop_registry``) over the peak,
and the bytes it reads and writes (``torch.utils._runtime_estimation.get_num_bytes``) over the
memory bandwidth. It takes both ceilings from a CUDA device or a CUDA datasheet, and refuses to run
without an accelerator (``torch.accelerator.is_available()``). This mode applies the same model with
the ceilings of the device table (``devices.Roofline``: a trn2 rank, or a CPU measured by the
bench), and, like ``RuntimeEstimator``, leaves communication out: on the fake process group a
collective costs nothing, so the time is what the rank computes and moves, with perfect overlap (``comm.py`` prices the collectives for ``parallel=auto``). On a CPU each op
also pays a fixed cost (``Roofline.op_seconds``, measured by ``cpu_roofline.py``): a small model's
CPU step is mostly dispatch, not FLOPs.

Two gaps in torch's tables, filled here:
- ops that move no data: ``_IGNORE_OPS`` skips views and most creation ops, but not the ``prim``
  namespace (``prim.device`` reads a tensor's device and was priced at the bytes of its whole
  input: 1.4 s of a 2.8 s traced 30B-A3B step, 2026-12-06) nor ``aten.empty*`` (an allocation,
  like the ``zeros_like`` torch already skips);
- ``aten._grouped_mm`` (torchtitan's routed experts, AWS's MoE route on Neuron since SDK 2.34) has
  no entry in ``flop_registry``, so its FLOPs counted 0: ``grouped_mm_flops`` counts them.
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
_NO_TRAFFIC = {torch.ops.aten.empty, torch.ops.aten.empty_strided, torch.ops.aten.empty_like}


def grouped_mm_flops(mat_a: torch.Tensor, out: torch.Tensor) -> int:
    """FLOPs of ``torch._grouped_mm(mat_a, mat_b, offs)``: each output element is a dot product
    of ``mat_a.shape[-1]`` (K) products, except 2D x 2D, where the groups split K between them
    (``out`` is ``[G, M, N]``, each group contracting its own slice of K), so the sum is M x N x K.
    Shapes: torch.nn.functional.grouped_mm's documentation."""
    dot = 2 * mat_a.shape[-1]
    if mat_a.dim() == 2 and out.dim() == 3:
        return dot * out.numel() // out.shape[0]
    return dot * out.numel()


def _flops(func, args, kwargs, out) -> int | None:
    packet = func._overloadpacket
    if packet is torch.ops.aten._grouped_mm:
        return grouped_mm_flops(args[0], out)
    if packet in flop_registry:
        return flop_registry[packet](*args, **(kwargs or {}), out_val=out)
    return None


class RooflineMode(TorchDispatchMode):
    """Sums the roofline time (seconds) and the FLOPs of the ops it sees."""

    def __init__(self, ceilings: Roofline, skip=lambda: False) -> None:
        super().__init__()
        self.ceilings, self.skip = ceilings, skip
        self.seconds = 0.0
        self.flops = 0.0
        self.ops = 0  # the ops priced (each also pays ``ceilings.op_seconds``)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented  # DTensor first: this mode then sees the rank's local ops
        out = func(*args, **(kwargs or {}))
        packet = func._overloadpacket
        ignored = packet in _IGNORE_OPS or packet in _NO_TRAFFIC
        if self.skip() or ignored or func.namespace in ("c10d", "_c10d_functional", "prim"):
            return out
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        moved = sum(get_num_bytes(t) for t in inputs + outputs)
        seconds = moved / self.ceilings.bytes_per_second
        flops = _flops(func, args, kwargs, out) if outputs else None
        if flops is not None:
            half = outputs[0].dtype in _HALF
            peak = self.ceilings.bf16_flops if half else self.ceilings.fp32_flops
            self.flops += flops
            seconds = max(seconds, flops / peak)
        self.seconds += seconds + self.ceilings.op_seconds
        self.ops += 1
        return out
