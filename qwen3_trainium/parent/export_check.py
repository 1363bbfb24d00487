"""After an HF export: reload it with ``AutoModelForCausalLM`` and compare logits (and, for
eval=on's samples, ``samples.py``, run its ``generate`` on the ranks' prompts). Both checks pass or
fail the run (exit 3) in every training dtype.

The rank saved the trained model's logits on a fixed probe batch (``export_probe.pt``). A fresh
Python process (``python -m qwen3_trainium.parent.export_check``) loads the exported directory with
Transformers alone, as a user would, and runs the same tokens. It must be a fresh process:
building torchtitan's HF backend model (the parent does, on the meta device, to check weights)
patches Transformers' model classes for the rest of that process.

Float32 on both sides: the probe ran the trained model with its weights rounded to
``checkpoint.export_dtype`` (what the export holds) and every op in float32, bfloat16 training
included (``rank/float32_forward.py``), and the export is loaded in float32. What is left is
float32 rounding, so the tolerance stays tight and catches what a bfloat16 comparison cannot:
measured on CPU (model=nki_moe, 2 ranks, bfloat16 training) an honest export is within 7e-7
while two swapped experts of one layer move the logits by 2.1e-2 and one transposed expert by
2.3e-2: as much as the bfloat16 probe this replaced erred on an honest export (1.5e-2, model=native,
2 ranks; 1.8e-2 at one rank, where torchtitan's FSDP casts too). No bfloat16 tolerance separates
them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.export_facts import TOLERANCE, cast_matmuls, export_dir
from qwen3_trainium.shared import lifeline
from qwen3_trainium.shared.contract import PROBE_NAME

REPORT_NAME = "export_check.json"


def max_logit_diff(directory: str, probe_path: str) -> float:
    """Run in a fresh process: from_pretrained(directory) in float32 vs the saved probe logits."""
    import torch
    from transformers import AutoModelForCausalLM

    probe = torch.load(probe_path)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        logits = model(probe["tokens"]).logits.float()
    return (logits - probe["logits"]).abs().max().item()


def _probe_flags(device: str, probe_path: str) -> str:
    if device != "neuron":
        return ""
    import torch

    return torch.load(probe_path).get("neuron_cc_flags", "")


def adapter_export(run: RunConf, run_dir: str) -> str | None:
    """peft=lora without a merged export: the newest ``step-N-adapter`` directory."""
    folder = os.path.join(run_dir, run.checkpoint.folder)
    found = []
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            head, _, tail = name.partition("-adapter")
            if name.startswith("step-") and tail == "" and head[5:].isdigit():
                found.append((int(head[5:]), os.path.join(folder, name)))
    return max(found)[1] if found else None


def max_adapter_logit_diff(directory: str, probe_path: str) -> float:
    """Run in a fresh process: the adapter's base (``base_model_name_or_path``) from_pretrained,
    each PEFT adapter folded into the parameter its key names (``W += lora_alpha/r * B @ A``, PEFT's
    LoRA; per expert for ``target_parameters``), vs the saved probe logits. A key naming no module
    of the base fails."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    with open(os.path.join(directory, "adapter_config.json")) as f:
        config = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"], dtype=torch.float32)
    tensors = load_file(os.path.join(directory, "adapter_model.safetensors"))
    scale = config["lora_alpha"] / config["r"]
    with torch.no_grad():
        for stem in adapter_stems(tensors):
            a, b = (tensors[f"base_model.model.{stem}.lora_{ab}.weight"] for ab in "AB")
            param = adapted_parameter(model, stem, config.get("target_parameters") or [])
            param += scale * (b @ a if param.dim() == 2 else expert_delta(a, b, param.shape[0]))
        probe = torch.load(probe_path)
        logits = model(probe["tokens"]).logits.float()
    return (logits - probe["logits"]).abs().max().item()


def adapted_parameter(model, stem: str, target_parameters: list[str]):
    """The parameter a PEFT adapter stem adapts: a module's weight for ``target_modules``. For
    ``target_parameters`` PEFT 0.21.2 nests one ``ParamWrapper`` per targeted parameter of a
    module in registration order, the innermost under ``base_layer``: Qwen3-MoE's experts register
    ``gate_up_proj`` then ``down_proj``, so ``mlp.experts.base_layer`` is gate_up and
    ``mlp.experts`` the last targeted (down_proj, or the only one)."""
    module = stem.removesuffix(".base_layer")
    wanted = {p.rsplit(".", 1)[1] for p in target_parameters if module.endswith(p.rsplit(".", 1)[0])}
    if not wanted:
        return model.get_submodule(stem).weight
    owner = model.get_submodule(module)
    targeted = [name for name, _ in owner.named_parameters(recurse=False) if name in wanted]
    return getattr(owner, targeted[0] if stem != module else targeted[-1])


def expert_delta(a, b, experts: int):
    """PEFT's ``ParamWrapper`` delta of a 3-D ``[E, out, in]`` parameter without the scale: A
    ``[E*r, in]`` rows expert-major (``e*r + j``), B ``[out, r*E]`` columns rank-major
    (``j*E + e``); per expert ``B_e @ A_e`` (``peft/tuners/lora/layer.py``, ``get_delta_weight``)."""
    import torch

    rank = a.shape[0] // experts
    return torch.einsum("ore,eri->eoi", b.reshape(b.shape[0], rank, experts), a.reshape(experts, rank, -1))


def adapter_stems(tensors: dict) -> list[str]:
    """The modules a PEFT adapter file adapts, each with exactly one ``lora_A`` and one ``lora_B``
    (PEFT's key names). Any other key, or an A without its B, fails with the keys named: a wrong
    key map must not pass by leaving half an adapter out of the check."""
    halves: dict[str, set[str]] = {}
    odd = []
    for key in tensors:
        match = re.fullmatch(r"base_model\.model\.(.+)\.lora_([AB])\.weight", key)
        if match:
            halves.setdefault(match[1], set()).add(match[2])
        else:
            odd.append(key)
    odd += [f"{stem}: lora_{''.join(sorted(h))} only" for stem, h in halves.items() if h != {"A", "B"}]
    if odd:
        raise ValueError(
            f"adapter_model.safetensors: keys that are not one lora_A and one lora_B per module: {odd}"
        )
    return sorted(halves)


def verify(run: RunConf, run_dir: str) -> tuple[bool, str]:
    """(passed, one line for the terminal); also writes ``export_check.json``."""

    directory, probe_path = export_dir(run, run_dir), os.path.join(run_dir, PROBE_NAME)
    adapter = run.peft.method.value == "lora" and not run.peft.merge_on_export
    if adapter:
        directory = adapter_export(run, run_dir)
    if directory is None or not os.path.isfile(probe_path):
        return False, f"export check: no HF export or probe under {run_dir}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwen3_trainium.parent.export_check",
            *(["--adapter"] if adapter else []),
            directory,
            probe_path,
        ],
        capture_output=True,
        text=True,
        preexec_fn=lifeline.preexec(os.getpid()),  # dies with the launcher
    )
    if proc.returncode != 0:
        return False, f"export check: AutoModelForCausalLM could not load {directory}:\n{proc.stderr[-2000:]}"
    diff = float(proc.stdout.strip().splitlines()[-1])
    device = run.device.type.value
    tolerance, cast = TOLERANCE[device], cast_matmuls(device, _probe_flags(device, probe_path))
    passed = diff <= tolerance and cast is None
    with open(os.path.join(run_dir, REPORT_NAME), "w") as f:
        json.dump({"export_dir": directory, "max_abs_logit_diff": diff, "tolerance": tolerance}, f)
    verdict = f"<= {tolerance}: OK" if diff <= tolerance else f"> {tolerance}: FAILED"
    if cast is not None:
        verdict = f"FAILED: {cast}"
    what = "the base + this PEFT adapter" if adapter else "AutoModelForCausalLM"
    return passed, (
        f"export round trip ({directory}): {what} max abs logit diff {diff:.3e}"
        f" (float32 both sides, {device}) {verdict}"
    )


if __name__ == "__main__":
    if sys.argv[1] == "--adapter":  # python -m qwen3_trainium.parent.export_check --adapter DIR PROBE
        print(max_adapter_logit_diff(sys.argv[2], sys.argv[3]))
    else:  # python -m qwen3_trainium.parent.export_check DIR PROBE
        print(max_logit_diff(sys.argv[1], sys.argv[2]))
