"""One forward of a trained model in float32, whatever the run trains in: what the export check's
probe and the samples run, so that they can be compared with Transformers in float32.

Why: with ``training.mixed_precision_param=bfloat16`` FSDP2 all-gathers every parameter in
bfloat16 and the whole forward computes in bfloat16 (at one rank too: torchtitan applies
``fully_shard`` on a mesh of one, and FSDP casts there as well). Such logits differ from a float32
reload of the export by ~1e-2, which hides a wrong key map, a wrong q/k/v split or a transposed
expert. Within ``float32_forward`` the same sharded float32 master weights are gathered in float32
and every op of the forward computes in float32, so the probe equals Transformers' float32
forward of the export to float32 rounding on CPU, in every training dtype.

FSDP2 has no public switch for the all-gather dtype (``MixedPrecisionPolicy`` is fixed at
``fully_shard``), so this reaches into torch's private FSDP state, all of it listed as seams in
``config/seams.py`` (a torch that renames one fails pre-flight, not here):
- ``FSDPParam.param_dtype`` (torch/distributed/fsdp/_fully_shard/_fsdp_param.py) is the dtype
  ``all_gather_inputs`` casts the shard to; None gathers the float32 shard as it is;
- ``FSDPParam.all_gather_outputs`` and ``_unsharded_param`` are allocated once, at the first
  gather, in that first dtype (``init_all_gather_outputs`` and ``init_unsharded_param`` return
  early afterwards): they are set aside so the float32 gather allocates its own, and put back;
- ``FSDPState._mp_policy`` and ``FSDPParamGroup.mp_policy``: the policy forward inputs and
  outputs are cast by, and the one the group's dtypes were read from; a float32 copy within;
- ``FSDPState._lazy_init``: FSDP's own first-forward initialisation, run on entry (a no-op once
  the run has trained a step) so that the dtypes are read from the run's policy, not ours.
Every FSDP module is resharded (``FSDPModule.reshard``, public) on entry, so no bfloat16 copy is
in use, and on exit, so no float32 copy outlives the block; then everything is put back, so the
next gather is the bfloat16 one the run had (training after this block is bit-identical to training
without it: ``tests/rank/test_float32_forward.py``).

Also within: routed experts compute in float32 (``models/overrides/experts.float32_experts``),
and float32 matmuls in full float32 (``torch.set_float32_matmul_precision("highest")``: at "high"
or "medium", which a user's code may set, CUDA rounds float32 matmul inputs to TF32 or bfloat16,
https://docs.pytorch.org/docs/stable/generated/torch.set_float32_matmul_precision.html; PyTorch
says the flag affects CUDA only). Neuron's compiler casts float32 matmuls to bfloat16 by default,
which no flag of PyTorch's changes: ``parent/export_check.py`` says what that means for the check.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from qwen3_trainium.models.overrides.experts import float32_experts

_UNSET = object()


def _fsdp_modules(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


class _Float32Gathers:
    """FSDP2's all-gathers in the parameters' own dtype (float32) within, the run's on exit."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.root, self.modules = model, _fsdp_modules(model)
        self.saved: list[tuple] = []

    def __enter__(self):
        if self.modules and self.modules[0] is self.root:
            # what FSDP's first forward does (a no-op after it): the groups read their policy
            # now, so a process whose first forward is this one keeps the run's dtypes after it
            self.root._get_fsdp_state()._lazy_init()
        for module in self.modules:
            module.reshard()
        for module in self.modules:
            state = module._get_fsdp_state()
            self.saved.append((state, "_mp_policy", state._mp_policy))
            state._mp_policy = _float32(state._mp_policy)
            for group in state._fsdp_param_groups:
                self.saved.append((group, "mp_policy", group.mp_policy))
                group.mp_policy = _float32(group.mp_policy)
                for param in group.fsdp_params:
                    self._set_aside(param)
        return self

    def _set_aside(self, param) -> None:
        for name in ("param_dtype", "all_gather_outputs", "_unsharded_param"):
            self.saved.append((param, name, getattr(param, name, _UNSET)))
        param.param_dtype = None
        param.all_gather_outputs = []
        if hasattr(param, "_unsharded_param"):
            del param._unsharded_param

    def __exit__(self, *exc) -> None:
        for module in self.modules:
            module.reshard()  # frees the float32 copies (reshard_after_forward=False kept them)
        for owner, name, value in reversed(self.saved):
            if value is _UNSET:
                if hasattr(owner, name):
                    delattr(owner, name)
            else:
                setattr(owner, name, value)
        self.saved.clear()


def _float32(policy):
    """The policy with no parameter or output cast (reduce_dtype only matters in backward)."""
    return dataclasses.replace(policy, param_dtype=None, output_dtype=None)


@contextlib.contextmanager
def _full_float32_matmuls():
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@contextlib.contextmanager
def float32_forward(model: torch.nn.Module):
    """Within: forwards of ``model`` (a torchtitan model part, FSDP-wrapped or not) compute in
    float32 on its float32 weights. Weights are not changed; the run's precision is back on exit."""
    with _Float32Gathers(model), float32_experts(model), _full_float32_matmuls():
        yield
