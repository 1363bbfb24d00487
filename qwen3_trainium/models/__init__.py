"""Model code, run wherever a model is built (ranks, the parent's meta-device checks, the trace):
the Transformers model and config for ``model=hf``, torchtitan overrides (attention, experts,
NKI), the NKI kernels with their pure-PyTorch references (``kernels``, which import nothing else
of the project), HF export and expert-layout conversion.
"""
