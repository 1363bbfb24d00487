"""torch's and torchtitan's step code adapted for a trace on fake tensors (``memory/trace.py``).

Four adaptations, each because a fake tensor has shapes but no values, or because the trace
runs inside its own ``FakeTensorMode`` where torch's tools expect eager tensors:
- ``step_tracker``: torch's ``MemTracker``, faster, and at ease with torchtitan's chunked loss;
- ``untracked_sharding_propagation``: DTensor's global-shape metadata runs are not memory;
- ``balanced_routing``: expert parallel's all-to-all sized without token counts;
- ``float32_grouped_mm``: torch's fake ``_grouped_mm`` for the float32 experts CPU runs.
And ``load_parts``: the peak of ``initial_load_in_hf``, from the traced tensors.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def untracked_sharding_propagation(tracker):
    """DTensor derives each op's output metadata by running it on global-shape fake tensors
    (``ShardingPropagator._propagate_tensor_meta_non_cached``), under the active fake mode,
    which here is the trace's own: MemTracker would count those tensors (a 151,936 x 4,096
    float32 embedding at full size on every rank of an 8B trace). In eager runs they live in
    DTensor's private fake mode and MemTracker skips them; here a flag does."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self, *args, **kwargs):
        tracker.propagating += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            tracker.propagating -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original


@contextlib.contextmanager
def balanced_routing():
    """Expert parallel without token counts: torchtitan's all-to-all dispatcher sizes its
    exchange from the counts each rank routes (``_sync_token_count_exchange``: ``tolist()``),
    which fake tensors do not have. Here every rank sends an equal share of its ``T x K`` routed
    tokens to each expert-parallel peer and receives as much: balanced routing, the load
    torchtitan's balancing aims at."""
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    dispatch, exchange = AllToAllTokenDispatcher.dispatch, AllToAllTokenDispatcher._sync_token_count_exchange
    routed = [0]

    def counted_dispatch(self, x_TD, topk_scores_TK, topk_expert_ids_TK, *args, **kwargs):
        routed[0] = topk_expert_ids_TK.numel()
        return dispatch(self, x_TD, topk_scores_TK, topk_expert_ids_TK, *args, **kwargs)

    def balanced(self, num_local_tokens_per_expert_E, num_global_EP_e, ep_size):
        share = [routed[0] // ep_size] * ep_size
        share[-1] += routed[0] - sum(share)
        return num_global_EP_e.reshape(-1), share, list(share)

    AllToAllTokenDispatcher.dispatch = counted_dispatch
    AllToAllTokenDispatcher._sync_token_count_exchange = balanced
    try:
        yield
    finally:
        AllToAllTokenDispatcher.dispatch, AllToAllTokenDispatcher._sync_token_count_exchange = (
            dispatch,
            exchange,
        )


@contextlib.contextmanager
def float32_grouped_mm():
    """torch's meta function of ``_grouped_mm`` implements the CUDA kernel's checks
    (``torch/_meta_registrations.py`` ``_meta_grouped_mm_common``: bfloat16, float16 or fp8), but
    the CPU kernel also runs float32, which torchtitan's experts compute in on CPU with float32
    parameters (``overrides/experts.py``). For float32 operands the output follows the same shape
    rule (``_create_grouped_mm_output_tensor``); every other dtype keeps torch's checks."""
    import torch
    from torch import _meta_registrations as meta

    common = meta._meta_grouped_mm_common

    def with_float32(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
                     out_dtype=None, use_fast_accum=False):  # fmt: skip
        if mat_a.dtype == mat_b.dtype == torch.float32 and scale_a is None and bias is None:
            return meta._create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)
        return common(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_dtype, use_fast_accum)

    meta._meta_grouped_mm_common = with_float32
    try:
        yield
    finally:
        meta._meta_grouped_mm_common = common


@contextlib.contextmanager
def adapted(tracker):
    """The step's code adapted for the trace (all but the tracker itself)."""
    with untracked_sharding_propagation(tracker), balanced_routing(), float32_grouped_mm():
        yield


class _NoHook:
    def remove(self) -> None:
        pass


def step_tracker():
    """torch's ``MemTracker``, told that a module called again outside every other module, in
    the same step, is a recompute: torchtitan's chunked loss calls ``lm_head`` once per chunk and
    again in its backward, where torch's module tracker has no parent but the global scope and
    ``MemTracker._pre_fw_hook`` would take it for a second iteration and raise. The call is
    then tracked afresh; tensors are keyed by storage, so nothing is counted twice."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class StepTracker(MemTracker):
        propagating = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.propagating:
                return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _update_peak_stats(self, peak_state) -> None:
            # The global peak only: torch's version also walks every module's stats after every
            # op (O(modules) per op: three quarters of an 8B trace's time, by cProfile).
            for device, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snap["Total"]:
                    self._peak_mem[device] = snap["Total"]
                    self._peak_mem_snap[device] = dict(snap)

        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            # A frozen parameter (peft=lora's base) never has a gradient, and torch's tracker would
            # register gradient hooks on it, which raises: it is marked as hooked already.
            for param in module.parameters():
                if not param.requires_grad:
                    self._param_to_grad_hook_handles.setdefault(param, (_NoHook(), _NoHook()))
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _pre_fw_hook(self, module, inputs) -> None:
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                name = self._mod_tracker.get_known_fqn(module)
                if set(self._mod_tracker.parents) - {name} == {"Global"}:
                    del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    return StepTracker()


def init_weights(model) -> None:
    """torchtitan's ``init_weights``: it fills the buffers (RoPE's cache) and, in the HF backend,
    ties the embeddings again after ``to_empty`` (``init_states``: ``tie_weights``; untied, a
    tied model's embedding would be counted twice, with its AdamW states). Values do not matter
    here, and ``trunc_normal_`` reads its bounds as Python numbers, which fake tensors do not
    have (``_no_grad_trunc_normal_``), so it is a no-op during the trace."""
    from unittest import mock

    import torch

    with torch.no_grad(), mock.patch("torch.nn.init.trunc_normal_", lambda tensor, *a, **k: tensor):
        model.init_weights(buffer_device=None)


def prime_optimizer(model_parts, optimizers) -> None:
    """What the first step leaves behind, without its forward and backward: AdamW's states. torch's
    AdamW allocates ``exp_avg``, ``exp_avg_sq`` and ``step`` lazily, at the first ``step()`` of a
    parameter that has a gradient; here every trainable parameter gets a gradient of zeros (the
    shape, dtype and placements the backward would give it), the optimizer steps once, and the
    gradients are dropped, as ``zero_grad`` drops them. The step traced next is then the old
    trace's second step; the first step's own peak never decides (it is the second's less the
    states). Tracing step 1 too cost 25-33 % more (Qwen3-30B-A3B 59.6 s against 44.6 s, 8B 44.0
    against 29.6). Against it, every part is equal to the byte but the activations, which read one
    micro-batch's hidden state less (the tracker itself kept step 1's chunked-loss input alive),
    and the roofline counts the same FLOPs and reads 0.07-0.46 % less time: FSDP copies a unit's
    gathered parameters out from its second all-gather on, and the lm_head's explicit unshard in
    torchtitan's chunked loss is one the primed step does not copy (``tests/memory/test_memtrace.py``)."""
    from unittest import mock

    import torch

    with torch.no_grad():
        for model in model_parts:
            for param in model.parameters():
                if param.requires_grad:
                    param.grad = torch.zeros_like(param)

    # The fused AdamW kernels (torch/optim/adam.py ``_fused_adam``) only update in place what
    # ``_init_group`` allocated, and this update is thrown away; on DTensors their sharding
    # propagation alone took 6.4 s of the headline's trace. (The traced step runs them in full.)
    def no_update(*args, **kwargs) -> None:
        return None

    with (
        mock.patch.object(torch, "_fused_adam_", no_update),
        mock.patch.object(torch, "_fused_adamw_", no_update),
    ):
        optimizers.step()
    optimizers.zero_grad()


HF_CHECKPOINT_BYTES = 2  # the published Qwen3 safetensors hold bfloat16


def load_parts(model) -> dict[str, int]:
    """The peak of ``initial_load_in_hf``, from the traced tensors: the rank's parameters, already
    materialised in ``training.dtype``, plus what torch's ``HuggingFaceStorageReader`` stages: one
    tensor's slice at a time, read in the checkpoint's bfloat16 and copied into the parameter
    (``hf_storage.py`` ``_process_read_request``); for MoE, torchtitan's ``from_hf`` stacks the
    per-expert tensors into new grouped tensors before ``load_state_dict`` copies them
    (``models/qwen3/state_dict_adapter.py``); with the fused experts (``model=nki_moe``) the
    adapter first reads into contiguous copies in torchtitan's layout and fuses gate and up again
    after the stack (``overrides/blockwise_experts.py``). Host-side reads (the file's mmap) are not device
    memory and are left out."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    params = {name: local(p) for name, p in model.named_parameters()}
    at_rest = sum(p.numel() * p.element_size() for p in params.values())
    experts = sum(p.numel() * p.element_size() for name, p in params.items() if "experts" in name)
    gate_up = sum(p.numel() * p.element_size() for name, p in params.items() if name.endswith("gate_up_ED2F"))
    parts = {
        "parameters (loaded into)": at_rest,
        "largest tensor read (bf16)": max((p.numel() for p in params.values()), default=0)
        * HF_CHECKPOINT_BYTES,
    }
    if gate_up:  # the fused layout (blockwise_experts.py): torchtitan's layout read into, then fused
        parts["experts as w1/w2/w3 (to_hf)"] = experts
    if experts:
        parts["experts restacked (from_hf)"] = experts
    if gate_up:
        parts["gate/up fused (from_hf)"] = gate_up
    return parts
