"""Pre-flight checks of where objective=dpo's reference log-probs come from (docs/dpo.md, "The
reference"): the mode against peft, ``objective.dpo.reference_path``, and on a resume the tables
the run's first start computed. Standard library only."""

from __future__ import annotations

import glob
import os

from qwen3_trainium.config.choices import DPOReference, Objective
from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight.problem import Problem
from qwen3_trainium.rank.dpo_config import reference_mode
from qwen3_trainium.shared.contract import latest_step


def check_reference(run: RunConf) -> list[Problem]:
    dpo, problems = run.objective.dpo, []
    mode = reference_mode(run)
    if mode is DPOReference.adapters_off and run.peft.method.value != "lora":
        problems.append(
            Problem(
                "objective.dpo.reference",
                "adapters_off",
                "the reference is the model with its LoRA adapters switched off, and this run has none",
                "peft=lora, or objective.dpo.reference=precompute (full fine-tuning)",
            )
        )
    path = dpo.reference_path
    if path and mode is DPOReference.adapters_off:
        problems.append(
            Problem(
                "objective.dpo.reference_path",
                path,
                "with reference=adapters_off the reference is this run's own base weights",
                "objective.dpo.reference=precompute, or leave objective.dpo.reference_path unset",
            )
        )
    elif path and not _hf_dir(path):
        problems.append(
            Problem(
                "objective.dpo.reference_path",
                path,
                "is no Hugging Face model directory (config.json and *.safetensors)",
                "objective.dpo.reference_path=<an HF directory>, or unset: the run's initial weights",
            )
        )
    return problems


def _hf_dir(path: str) -> bool:
    has_config = os.path.isfile(os.path.join(path, "config.json"))
    return has_config and bool(glob.glob(os.path.join(path, "*.safetensors")))


def check_reference_on_resume(run: RunConf, run_dir: str) -> list[Problem]:
    """A resumed reference=precompute run reads the tables its first start wrote: the weights it
    loads now are the trained policy's, which cannot give the reference again (the ranks refuse
    too, ``rank/dpo_reference.py``; here it is before anything starts)."""
    if (
        run.objective.kind is not Objective.dpo
        or reference_mode(run) is not DPOReference.precompute
        or not run.checkpoint.enable
    ):
        return []
    folder = os.path.join(run_dir, run.checkpoint.folder)
    latest = latest_step(folder)
    if latest is None or latest[1] != "dcp":
        return []
    from qwen3_trainium.rank.dpo_reference_key import table_path

    for split in ("train", "validation") if run.eval.enable else ("train",):
        try:
            path = table_path(run, split)
        except (OSError, ValueError):  # data that cannot be read: the data checks say why
            return []
        if not os.path.isfile(path):
            return [
                Problem(
                    "checkpoint.folder",
                    folder,
                    f"resumes at step {latest[0]}, and the reference log-probs of its {split} pairs that the"
                    f" run's first start computed are missing ({path}): the weights it would load are the"
                    " trained policy's, not the reference's",
                    f"restore {path}, or start from step 0 in a new run directory",
                )
            ]
    return []
