"""What the export check (``export_check.py``) and the samples check (``samples_check.py``)
share: where a finished run's HF export is, and how far an honest export's float32 logits may
lie from the ranks' float32 ones on each device.
"""

from __future__ import annotations

import os
import re

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.shared.contract import latest_step

# The largest max abs logit difference an honest export shows against the float32 probe, by device.
# cpu: float32 on both sides, but Transformers and torchtitan order some sums differently: measured
#   6e-7 to 1.2e-6 on the three paths' tiny models (hidden size 256), in float32 and bfloat16 runs.
# cuda, neuron: float32 matmuls too (the probe holds CUDA at "highest", PyTorch's full-float32
#   setting), summed in the device's order instead of the CPU's. A length-n dot product's rounding
#   error grows like sqrt(n) unit roundoffs in practice (Higham and Mary, "A New Approach to
#   Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019), n at worst (Higham,
#   "Accuracy and Stability of Numerical Algorithms", 2nd ed., ch. 3): from the CPU's 256 to
#   Qwen3-32B's 5120 that scales the measured CPU figure by about 4.5 (sqrt(20)), to a few 1e-6.
#   1e-4 leaves room for deeper models and stays 200 times below the smallest broken export measured
#   (2.1e-2, two experts swapped: ``export_check.py``).
#   Derived, not measured here (no device): tests/rank/test_on_device.py is where to record it.
TOLERANCE = {"cpu": 1e-5, "cuda": 1e-4, "neuron": 1e-4}
# neuronx-cc casts float32 matmuls to bfloat16 unless told not to: "By default, the Neuron Compiler
# will automatically cast FP32 matrix multiplication operations to BF16" (AWS, Mixed Precision and
# Performance-accuracy Tuning (neuronx-cc), https://awsdocs-neuron.readthedocs-hosted.com/en/latest/
# general/appnotes/neuronx-cc/neuronx-cc-training-mixed-precision.html); TorchNeuron compiles each
# eager op with neuronx-cc (AWS, Best practices for TorchNeuron, https://awsdocs-neuron.readthedocs-
# hosted.com/en/latest/torch/reference/best-practices-pytorch-neuron.html). A probe whose matmuls were cast
# carries a bfloat16 error, which hides a broken export (``export_check.py``): the check fails
# and says why.
NEURON_FP32_MATMULS = re.compile(r"--auto-cast[= ]none\b")
AUTO_CAST = re.compile(r"--auto-cast[= ](\S+)")


def probe_compared(run: RunConf) -> bool:
    """Whether a check compares the ranks' float32 forwards with the HF export: the export check,
    or eval=on's samples, after an HF export."""
    ck, ev = run.checkpoint, run.eval
    sampled = ev.enable and ev.sample_tokens > 0 and bool(ev.sample_prompts)
    return ck.enable and ck.last_save_in_hf and (ck.export_check or sampled)


def neuron_cc_flags(run: RunConf, environ) -> dict[str, str]:
    """The ranks' ``NEURON_CC_FLAGS`` on Neuron when a check compares float32 forwards: the user's
    flags plus ``--auto-cast=none``, so that the probe's float32 matmuls stay float32. Where the user
    sets no ``--auto-cast``, nothing else changes: with training.mixed_precision_param=bfloat16 the
    training matmuls are bfloat16 already (FSDP casts the parameters), which auto-cast leaves alone.
    A user's own ``--auto-cast`` is kept (pre-flight refuses one other than none: ``preflight/heldout.py``)."""
    if run.device.type.value != "neuron" or not probe_compared(run):
        return {}
    flags = environ.get("NEURON_CC_FLAGS", "")
    if AUTO_CAST.search(flags):
        return {}
    return {"NEURON_CC_FLAGS": f"{flags} --auto-cast=none".strip()}


def export_dir(run: RunConf, run_dir: str) -> str | None:
    latest = latest_step(os.path.join(run_dir, run.checkpoint.folder))
    return (
        os.path.join(run_dir, run.checkpoint.folder, f"step-{latest[0]}")
        if latest and latest[1] == "hf"
        else None
    )


def cast_matmuls(device: str, neuron_cc_flags: str) -> str | None:
    """Why the ranks' float32 matmuls were not float32 (neuronx-cc's default), else None."""
    if device != "neuron" or NEURON_FP32_MATMULS.search(neuron_cc_flags):
        return None
    return (
        f"the ranks' NEURON_CC_FLAGS={neuron_cc_flags!r} leave neuronx-cc's default, which casts float32"
        " matmuls to bfloat16, so the ranks' side carries a bfloat16 error as large as a broken export's;"
        " rerun with NEURON_CC_FLAGS='--auto-cast=none' in the environment (or checkpoint.export_check=false)"
    )
