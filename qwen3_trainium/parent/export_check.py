"""After an HF export: reload it with ``AutoModelForCausalLM`` and compare logits (and, for
eval=on's samples, ``samples.py``, run its ``generate`` on the ranks' prompts).

The rank saved the trained model's logits on a fixed probe batch (``export_probe.pt``). A fresh
Python process (``python -m qwen3_trainium.parent.export_check``) loads the exported directory with
Transformers alone, as a user would, and runs the same tokens. It must be a fresh process:
building torchtitan's HF backend model (the parent does, on the meta device, to check weights)
patches Transformers' model classes for the rest of that process. The probe ran the trained model
with its weights rounded to ``checkpoint.export_dtype`` and the export is loaded in float32, so
with float32 training compute the two must agree to 1e-5 whatever the export dtype (bf16, as the
Hub carries, included); otherwise the figure is reported only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from qwen3_trainium.config.schema import ParamDtype, RunConf
from qwen3_trainium.rank import samples
from qwen3_trainium.shared import lifeline
from qwen3_trainium.shared.contract import PROBE_NAME, latest_step

TOLERANCE = 1e-5
REPORT_NAME = "export_check.json"


def export_dir(run: RunConf, run_dir: str) -> str | None:
    latest = latest_step(os.path.join(run_dir, run.checkpoint.folder))
    return (
        os.path.join(run_dir, run.checkpoint.folder, f"step-{latest[0]}")
        if latest and latest[1] == "hf"
        else None
    )


def max_logit_diff(directory: str, probe_path: str) -> float:
    """Run in a fresh process: from_pretrained(directory) vs the saved probe logits."""
    import torch
    from transformers import AutoModelForCausalLM

    probe = torch.load(probe_path)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        logits = model(probe["tokens"]).logits.float()
    return (logits - probe["logits"]).abs().max().item()


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
    each PEFT adapter folded into the module its key names (``W += lora_alpha/r * B @ A``, PEFT's
    LoRA), vs the saved probe logits. A key naming no module of the base fails."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    with open(os.path.join(directory, "adapter_config.json")) as f:
        config = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"], dtype=torch.float32)
    tensors = load_file(os.path.join(directory, "adapter_model.safetensors"))
    scale = config["lora_alpha"] / config["r"]
    with torch.no_grad():
        for key, a in tensors.items():
            if key.endswith(".lora_A.weight"):
                stem = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                b = tensors[key.replace(".lora_A.weight", ".lora_B.weight")]
                model.get_submodule(stem).weight += scale * (b @ a)
        probe = torch.load(probe_path)
        logits = model(probe["tokens"]).logits.float()
    return (logits - probe["logits"]).abs().max().item()


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
    exact = run.training.mixed_precision_param is ParamDtype.float32
    passed = diff <= TOLERANCE or not exact
    with open(os.path.join(run_dir, REPORT_NAME), "w") as f:
        json.dump(
            {"export_dir": directory, "max_abs_logit_diff": diff, "tolerance": TOLERANCE if exact else None},
            f,
        )
    if not exact:
        verdict = "(not float32 end to end: reported only)"
    else:
        verdict = f"<= {TOLERANCE}: OK" if passed else f"> {TOLERANCE}: FAILED"
    what = "the base + this PEFT adapter" if adapter else "AutoModelForCausalLM"
    return passed, f"export round trip ({directory}): {what} max abs logit diff {diff:.3e} {verdict}"


def generated_ids(directory: str, samples_path: str) -> list[list[int]]:
    """Run in a fresh process: ``generate`` on the export, greedy, with the prompt ids, EOS ids
    and token counts the ranks used (``samples.json``); the new ids of each prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    with open(samples_path) as f:
        record = json.load(f)
    eos = record["eos_ids"] or None  # none: the export's own generation_config decides
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    out = []
    for sample in record["samples"]:
        ids = torch.tensor([sample["prompt_ids"]], dtype=torch.long)
        steps = sample.get("max_new_tokens", record["tokens"])
        if not sample["prompt_ids"] or not steps:  # as greedy: no sample
            out.append([])
            continue
        with torch.no_grad():
            seq = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=steps,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0] if eos else None,
            )
        out.append(seq[0, ids.shape[1] :].tolist())
    return out


def exact(run) -> bool:
    """The ids must be equal: float32 weights and compute, a float32 export, CPU on both sides
    (elsewhere the ranks' float32 kernels differ from CPU's: a near tie may go either way)."""
    return (
        run.training.mixed_precision_param.value == "float32"
        and run.checkpoint.export_dtype.value == "float32"
        and run.device.type.value == "cpu"
    )


def after_run(run, run_dir: str) -> tuple[bool, str]:
    """Launcher side, after the run (and the export check): (passed, one line for the terminal)."""
    path = os.path.join(run_dir, samples.SAMPLES_JSON)
    if not os.path.isfile(path):
        if run.eval.sample_tokens == 0 or not run.eval.sample_prompts:
            return True, ""
        return False, f"samples: rank 0 wrote no {path} (see the rank logs under {run_dir})"
    record, md = samples._read_json(path), os.path.join(run_dir, samples.SAMPLES_MD)
    cut = samples.cut_short(record)
    note = f" ({len(cut)} cut short by training.seq_len={record['max_len']})" if cut else ""
    exported = run.checkpoint.enable and run.checkpoint.last_save_in_hf
    directory = export_dir(run, run_dir) if exported else None
    if directory is None:
        return True, f"samples{note}: {md}"
    proc = subprocess.run(
        [sys.executable, "-m", "qwen3_trainium.parent.export_check", "--generate", directory, path],
        capture_output=True,
        text=True,
        preexec_fn=lifeline.preexec(os.getpid()),  # dies with the launcher
    )
    if proc.returncode != 0:
        return False, f"samples: AutoModelForCausalLM.generate failed on {directory}:\n{proc.stderr[-2000:]}"
    generated = json.loads(proc.stdout.strip().splitlines()[-1])
    return _compare(record, generated, directory, exact(run), path, note)


def _compare(record: dict, generated: list[list[int]], directory: str, exact: bool, path: str, note: str):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))  # the export's own
    diffs = [
        samples.first_difference(s["generated_ids"], g)
        for s, g in zip(record["samples"], generated, strict=True)
    ]
    record["export"] = {
        "dir": directory,
        "exact": exact,
        "generated_ids": generated,
        "texts": [tokenizer.decode(g, skip_special_tokens=False) for g in generated],
        "first_difference": diffs,
    }
    samples.write(path, record)
    n, md = len(diffs), os.path.join(os.path.dirname(path), samples.SAMPLES_MD)
    head = f"samples ({n} prompts, {record['tokens']} tokens){note}"
    differing = [(s["prompt"], k) for s, k in zip(record["samples"], diffs, strict=True) if k is not None]
    if not differing:
        return True, f"{head}: identical to AutoModelForCausalLM.generate on the export: {md}"
    prompt, k = differing[0]
    verdict = "FAILED" if exact else "(not float32 on CPU end to end: reported only)"
    return not exact, (
        f"{head}: {len(differing)} of {n} differ from AutoModelForCausalLM.generate on the export"
        f" ({prompt!r} at token {k}) {verdict}: {md}"
    )


if __name__ == "__main__":
    if (
        sys.argv[1] == "--generate"
    ):  # python -m qwen3_trainium.parent.export_check --generate DIR SAMPLES_JSON
        print(json.dumps(generated_ids(sys.argv[2], sys.argv[3])))
    elif sys.argv[1] == "--adapter":  # python -m qwen3_trainium.parent.export_check --adapter DIR PROBE
        print(max_adapter_logit_diff(sys.argv[2], sys.argv[3]))
    else:  # python -m qwen3_trainium.parent.export_check DIR PROBE
        print(max_logit_diff(sys.argv[1], sys.argv[2]))
