"""Guarded access to NKI and the NKI Library (present only on Trainium hosts), and how kernels are called.

Sources, for every Neuron-facing line in ``kernels/``:
- Signatures: aws-neuron/nki-library, tag 2.29 (commit ddbca35e; ``main`` d2ad3a57 holds the same
  three files, unchanged since 2.28). No 2.33 tag was public when this was written; AWS's
  SDK 2.33-era API pages (nki/library/api/moe-cte.rst, blockwise-mm-backward.rst) only add
  optional parameters. ``NKI_LIBRARY_CHECKED`` says this, and ``SIGNATURES`` lists every
  parameter we pass; ``make test-neuron`` compares them with the installed nkilib.
- Packages: since SDK 2.33 ``nki`` is its own package (``import nki``); the NKI Library is bundled
  with neuronx-cc as ``nkilib`` (or ``pip install nki-library`` overrides it; nki-library README).
- Launch: "The LNC (Logical NeuronCore) degree can be set at the callsite using bracket syntax:
  kernel[lnc](args) ... must match the NEURON_LOGICAL_NC_CONFIG environment variable"
  (``nki.jit`` docstring, SDK 2.31). SDK 2.33.1's LNC page keeps both ways ("specified using the
  NEURON_LOGICAL_NC_CONFIG environment variable or via bracket syntax at the kernel call site",
  nki/get-started/about/lnc.html); the launcher sets that variable to ``device.lnc`` and calls
  use the same value, so the two always match. (AWS's NCC_EVRF066 page says the bracket syntax
  "is being deprecated"; a matching grid keeps working.)
- Outputs: every kernel's result is taken from its return value (``rope_hf`` ends
  ``return q_out, k_out``; ``moe_cte`` / ``blockwise_mm_bwd`` allocate and return theirs), never
  read back from a buffer passed in: under ``torch.compile(backend="neuron")`` a kernel call is
  one graph node, and only its outputs are its results.

PyPI's ``nki`` / ``torch-neuronx`` packages are placeholders that raise ImportError: every
import here is guarded, and nothing else in the project imports them.
"""

from __future__ import annotations

import functools
import os

NKI_LIBRARY_CHECKED = "aws-neuron/nki-library 2.29 (ddbca35e; same files on main d2ad3a57)"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
FIX = (
    "on a Trainium host, install the Neuron SDK 2.33 packages into this venv (make setup-neuron: "
    "nki, and neuronx-cc, which bundles the NKI Library as nkilib); or model.kernels=[] to run the "
    "pure-PyTorch references on purpose"
)

# The parameters this project passes to each kernel (module:function -> names).
SIGNATURES = {
    "nkilib.core.embeddings.rope_hf:rope_hf": ("q", "k", "q_out", "k_out", "rope_cache", "backward"),
    "nkilib.core.moe.moe_cte.moe_cte:moe_cte": (
        "hidden_states", "expert_affinities_masked", "gate_up_proj_weight", "down_proj_weight",
        "token_position_to_id", "block_to_expert", "block_size", "spec", "activation_function",
        "compute_dtype", "is_tensor_update_accumulating", "expert_affinities_scaling_mode",
    ),
    "nkilib.experimental.moe.bwd.blockwise_mm_backward:blockwise_mm_bwd": (
        "hidden_states", "expert_affinities_masked", "gate_up_proj_weight", "down_proj_weight",
        "gate_up_proj_act_checkpoint_T", "down_proj_act_checkpoint", "token_position_to_id",
        "block_to_expert", "output_hidden_states_grad", "block_size", "compute_dtype",
        "is_tensor_update_accumulating",
    ),
}  # fmt: skip


@functools.cache
def runtime_error() -> str | None:
    """None when NKI and the NKI Library import, else what failed (package and error)."""
    for package in ("nki", "nkilib"):
        try:
            __import__(package)
        except Exception as err:  # ImportError, or the PyPI placeholders' own errors
            return f"import {package} failed ({type(err).__name__}: {err})"
    return None


def nki_runtime() -> bool:
    return runtime_error() is None


def on_neuron(*tensors) -> bool:
    """True when the op must run the NKI kernel: its tensors live on a Neuron device.

    A Neuron tensor without the NKI runtime is an error, never a silent fall-back to the
    reference (``model.kernels=[]`` is how a user runs the references on purpose)."""
    if not tensors or not all(t.device.type == "neuron" for t in tensors):
        return False
    error = runtime_error()
    if error:
        raise RuntimeError(f"NKI kernel requested on a Neuron device, but {error}. Fix: {FIX}")
    return True


def lnc() -> int:
    """Logical NeuronCore size the launcher set for this process (1 or 2; trn2 default 2)."""
    return int(os.environ.get(LNC_ENV, "2"))


def resolve(target: str):
    """The installed object for a ``module:function`` entry of ``SIGNATURES``."""
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def signature_mismatches() -> list[str]:
    """Each parameter we pass that the installed nkilib kernel does not take, by name."""
    import inspect

    problems = []
    for target, names in SIGNATURES.items():
        try:
            kernel = resolve(target)
        except Exception as err:
            problems.append(f"{target}: {type(err).__name__}: {err}")
            continue
        func = getattr(kernel, "func", None) or inspect.unwrap(kernel)
        params = inspect.signature(func).parameters
        missing = [n for n in names if n not in params]
        if missing:
            problems.append(f"{target} takes no {', '.join(missing)} (checked against {NKI_LIBRARY_CHECKED})")
    return problems
