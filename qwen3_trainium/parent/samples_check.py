"""The launcher's side of eval=on's samples (``rank/samples.py``): ``AutoModelForCausalLM.generate``
on the HF export must write the ids the ranks wrote, in every training dtype; else the run fails
(exit 3).

The ranks decode in float32 on the weights as the export holds them (``rank/float32_forward.py``,
rounded to ``checkpoint.export_dtype``), and the export is loaded in float32, so both sides run
the same float32 arithmetic. On CPU the ids must be equal. On another device float32 sums come in
another order than the CPU's (``export_facts.TOLERANCE``): each logit may differ by that tolerance,
so greedy may pick another id only where the ranks' two best logits were within twice it of each
other. A difference there is accepted and recorded with its margin; anywhere else it fails. Only
the first difference of a sample is judged: after it the two decode different prefixes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.export_facts import TOLERANCE, cast_matmuls, export_dir
from qwen3_trainium.rank import samples
from qwen3_trainium.shared import lifeline


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


def tie_margin(device: str) -> float:
    """How close the ranks' two best logits must be for a different id to be a near tie: 0 on CPU
    (the ids must be equal), twice the export check's tolerance elsewhere."""
    return 0.0 if device == "cpu" else 2 * TOLERANCE[device]


def after_run(run: RunConf, run_dir: str) -> tuple[bool, str]:
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
        [sys.executable, "-m", "qwen3_trainium.parent.samples_check", directory, path],
        capture_output=True,
        text=True,
        preexec_fn=lifeline.preexec(os.getpid()),  # dies with the launcher
    )
    if proc.returncode != 0:
        return False, f"samples: AutoModelForCausalLM.generate failed on {directory}:\n{proc.stderr[-2000:]}"
    generated = json.loads(proc.stdout.strip().splitlines()[-1])
    return compare(record, generated, directory, run.device.type.value, path, note)


def _margin_at(sample: dict, k: int) -> float | None:
    margins = sample.get("margins", [])
    return margins[k] if k < len(margins) else None  # past the ranks' ids: no tie to speak of


def compare(record: dict, generated: list[list[int]], directory: str, device: str, path: str, note: str):
    """Judge the export's ids against the ranks' (``record``, samples.json), write both into
    samples.json and samples.md; (passed, one line for the terminal)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))  # the export's own
    diffs = [
        samples.first_difference(s["generated_ids"], g)
        for s, g in zip(record["samples"], generated, strict=True)
    ]
    allowed = tie_margin(device)
    margins = [None if k is None else _margin_at(s, k) for s, k in zip(record["samples"], diffs, strict=True)]
    cast = cast_matmuls(device, record.get("neuron_cc_flags", ""))
    record["export"] = {
        "dir": directory,
        "exact": allowed == 0.0,
        "tie_margin": allowed,
        "generated_ids": generated,
        "texts": [tokenizer.decode(g, skip_special_tokens=False) for g in generated],
        "first_difference": diffs,
        "margin_at_difference": margins,
    }
    samples.write(path, record)
    n, md = len(diffs), os.path.join(os.path.dirname(path), samples.SAMPLES_MD)
    head = f"samples ({n} prompts, {record['tokens']} tokens){note}"
    differing = [
        (s["prompt"], k, m)
        for s, k, m in zip(record["samples"], diffs, margins, strict=True)
        if k is not None
    ]
    if not differing:
        return True, f"{head}: identical to AutoModelForCausalLM.generate on the export: {md}"
    ties = [d for d in differing if allowed > 0 and d[2] is not None and d[2] <= allowed and cast is None]
    prompt, k, margin = next((d for d in differing if d not in ties), differing[0])
    what = f"{len(differing)} of {n} differ from AutoModelForCausalLM.generate on the export"
    if len(ties) == len(differing):
        worst = max(m for _, _, m in ties)
        tie = f"margin <= {worst:.2e}, allowed {allowed:.0e} on {device}"
        return True, f"{head}: {what}, each at a near tie ({tie}): {md}"
    if cast is not None:
        why = cast
    elif allowed == 0.0:
        why = f"on {device} the ids must be equal"
    elif margin is None:
        why = "past the ranks' last id: not a near tie"
    else:
        why = f"the ranks' margin there {margin:.2e} > allowed {allowed:.0e} on {device}"
    return False, f"{head}: {what} ({prompt!r} at token {k}, {why}) FAILED: {md}"


if __name__ == "__main__":  # python -m qwen3_trainium.parent.samples_check EXPORT_DIR SAMPLES_JSON
    print(json.dumps(generated_ids(sys.argv[1], sys.argv[2])))
