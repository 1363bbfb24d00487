"""The last step of the full pre-flight: torchtitan validates the translated ``Trainer.Config``,
and the model it would build (on the meta device) is checked against the parallel degrees, the
device memory and the checkpoints it loads. Its parameter counts go to ``facts`` for the disk
check, which runs on every launch, a remembered pass included (``verdicts.Preflight``)."""

from __future__ import annotations

from qwen3_trainium.config.schema import MemoryMode, RunConf
from qwen3_trainium.parent.preflight.checkpoint import check_checkpoint_contents
from qwen3_trainium.parent.preflight.peft import check_targets, is_lora, trainable_note
from qwen3_trainium.parent.preflight.problem import Problem
from qwen3_trainium.parent.preflight.system import check_degrees, check_memory, check_trace
from qwen3_trainium.parent.preflight.titan import check_titan


def check_built(run: RunConf, run_dir: str, notes: list[str], facts: dict) -> list[Problem]:
    """torchtitan's own validation, then the model it would build and the checkpoints it loads."""
    problems, trial = check_titan(run, run_dir)
    if trial is None:
        return problems
    problems += check_shape(run, trial, notes, run_dir, facts)
    return problems + check_checkpoint_contents(run, run_dir, trial, notes)


def check_shape(run: RunConf, trial, notes: list[str], run_dir: str, facts: dict) -> list[Problem]:
    """Degrees and memory against the model as torchtitan will build it (on the meta device);
    with memory=trace, the traced peak decides instead of the estimate."""
    import torch

    from qwen3_trainium.memory import estimate

    target_problems = check_targets(run, trial.model_spec.model)
    if target_problems:
        return target_problems
    with torch.device("meta"):
        model = trial.model_spec.model.build()
    if is_lora(run):
        notes.append(trainable_note(model))
    shape = estimate.model_shape(trial.model_spec.model, model)
    facts["params"] = shape.params  # the disk check's (``host.check_disk``), run even when cached
    facts["trainable"] = shape.trained  # peft=lora: the adapters; AdamW holds state for these only
    problems, arithmetic = check_degrees(run, shape)
    notes.append("parallel degrees:\n" + arithmetic)
    memory_problems, planned = check_memory(run, shape)
    notes.append(
        f"device memory per rank (estimate, {shape.params / 1e6:,.1f}M parameters):\n" + planned.table()
    )
    if run.memory.mode is MemoryMode.trace and not problems:
        return check_trace(run, run_dir, planned.capacity, notes)
    if planned.capacity and not memory_problems and planned.total > 0.9 * planned.capacity:
        share = 100 * planned.total / planned.capacity
        notes.append(f"WARNING the memory estimate is {share:.0f}% of a rank's device memory")
    return problems + memory_problems
