"""Guarded access to TorchNeuron and the NKI library (present only on Trainium hosts).

PyPI's ``nki`` / ``torch-neuronx`` packages are placeholders that raise ImportError: every
import here is guarded, and nothing else in the project imports them.
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def nki_runtime() -> bool:
    """True when TorchNeuron's NKI op wrapper and the NKI library both import."""
    try:
        import nkilib  # noqa: F401
        from torch_neuronx import wrap_nki  # noqa: F401
    except Exception:  # ImportError, or the placeholders' own errors
        return False
    return True


def on_neuron(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "neuron" for t in tensors) and nki_runtime()


def lnc() -> int:
    """Logical NeuronCore size the launcher set for this process (1 or 2; default 2)."""
    return int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))


def wrapped(kernel):
    """An NKI kernel callable on torch tensors, launched on ``lnc()`` cores."""
    from torch_neuronx import wrap_nki

    return wrap_nki(kernel)[lnc()]
