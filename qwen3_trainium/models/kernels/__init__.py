"""Kernels: one interface each, an NKI implementation for Neuron and a pure-PyTorch reference.

Each kernel is a ``torch.library`` custom op (forward, fake/meta, backward). The op runs the
NKI kernel when its tensors live on a Neuron device and the NKI library is importable, and the
reference otherwise; layouts, packing and argument checks are shared, so CI on CPU runs the
same wrapper code a Trainium host runs. ``overrides/nki.py`` swaps them into torchtitan's
model through ``override.imports``.
"""

# kernel name (model.kernels) -> the @override factory that swaps it in
KERNEL_OVERRIDES = {
    "rope_hf": "qwen3_trainium.models.overrides.nki.rope_hf",
    "moe_experts": "qwen3_trainium.models.overrides.nki.moe_experts",
}
