"""Every check that can fail before a process starts, reported all together.

Each problem names the config key, the bad value and the fix. ``check`` never raises for a
user error: it returns the list, and the launcher prints it and exits non-zero.

Two tiers: ``check_static`` needs neither torch nor torchtitan (the config's own values, paths,
the world size); ``check`` is everything, including torchtitan's validation of the translated
``Trainer.Config`` and the model built on the meta device. The launcher runs ``check_static``
before any process starts and ``check`` either before (a dry run, a static problem) or while the
ranks import torch, which wait for its verdict before touching a device (``gate.py``).
"""

from __future__ import annotations

from qwen3_trainium.config.schema import MemoryMode, RunConf
from qwen3_trainium.parent.preflight.chat import check_attention_masks, check_chat, check_chat_static, is_chat
from qwen3_trainium.parent.preflight.checkpoint import (
    check_checkpoint_contents,
    check_checkpoint_paths,
    check_resume_kind,
    check_shard_size,
)
from qwen3_trainium.parent.preflight.data import (
    check_corpus,
    check_data,
    check_dataset_name,
    check_hub_dataset,
    check_tokenizer_fits,
    check_tokenizer_matches,
    needs_hub,
)
from qwen3_trainium.parent.preflight.files import check_inputs, check_load_step, check_writable
from qwen3_trainium.parent.preflight.heldout import (
    check_heldout,
    check_probe_length,
    check_samples,
    check_validation_path,
)
from qwen3_trainium.parent.preflight.host import check_disk, check_host, check_trackers
from qwen3_trainium.parent.preflight.keys import unknown_keys
from qwen3_trainium.parent.preflight.model import check_model, check_model_static, kernel_notes
from qwen3_trainium.parent.preflight.peft import check_peft_static, check_targets, is_lora, trainable_note
from qwen3_trainium.parent.preflight.problem import Problem, format_problems
from qwen3_trainium.parent.preflight.ranges import check_ranges
from qwen3_trainium.parent.preflight.run import (
    check_attention,
    check_compile,
    check_device,
    check_device_present,
    check_nodes,
    check_override_imports,
    check_titan,
    check_world_size,
    device_notes,
)
from qwen3_trainium.parent.preflight.stack import (
    check_nki_runtime,
    check_seams,
    installed_versions,
    trainium_notes,
    versions,
)
from qwen3_trainium.parent.preflight.system import check_degrees, check_memory, check_trace

__all__ = [
    "Problem",
    "check",
    "check_disk",
    "check_machine",
    "check_ranges",
    "check_static",
    "format_problems",
    "installed_versions",
    "missing_values",
    "unknown_keys",
]


def missing_values(cfg) -> list[Problem]:
    """Required values (``???``) nobody set: reported before the config is resolved."""
    from omegaconf import OmegaConf

    return [
        Problem(key, "???", "a required value is not set", f"{key}=<value> on the command line")
        for key in sorted(OmegaConf.missing_keys(cfg))
    ]


def check_machine(run: RunConf, run_dir: str, *, launching: bool, layout: str = "") -> list[Problem]:
    """What the config cannot say: the files a run reads (whole safetensors headers, config.json's
    architecture, the step it resumes at), the folders it writes, and, launching, this host's cores
    and memory and the trackers asked for. Standard library only; never cached (``cache.py``):
    files and hosts change under the same config. ``layout`` is the parallel group chosen."""
    problems = check_inputs(run) + check_load_step(run, run_dir) + check_writable(run, run_dir)
    if launching:
        problems += check_host(run, layout=layout) + check_trackers(run)
    return problems


def check_static(run: RunConf, run_dir: str, *, launching: bool) -> list[Problem]:
    """The checks that import neither torch nor torchtitan (milliseconds): a subset of ``check``."""
    return (
        check_device(run)
        + check_model_static(run)
        + check_attention(run)
        + check_compile(run)
        + check_ranges(run)
        + check_override_imports(run)
        + check_world_size(run)
        + check_nodes(run, launching=launching)
        + check_data(run)
        + (check_chat_static(run) if is_chat(run) else check_corpus(run))
        + check_attention_masks(run)
        + check_peft_static(run)
        + check_validation_path(run)
        + check_samples(run)
        + check_probe_length(run)
        + check_checkpoint_paths(run)
        + check_resume_kind(run, run_dir)
        + check_shard_size(run)
    )


def check(
    run: RunConf, run_dir: str, *, launching: bool, notes: list[str] | None = None, facts: dict | None = None
) -> list[Problem]:
    """All problems of a resolved run config; lines worth printing when all is well go to ``notes``,
    what later checks reuse (the model's parameter count) to ``facts``."""
    notes = notes if notes is not None else []
    version_problems, table = versions(run, launching=launching)
    seam_problems = check_seams(run)  # first: every check below imports torchtitan
    if seam_problems:
        return seam_problems + version_problems
    problems = check_device(run) + check_model(run)
    if problems:
        return problems  # the checks below need a known model and device
    problems += (
        check_attention(run)
        + check_compile(run)
        + check_ranges(run)
        + check_override_imports(run)
        + check_world_size(run)
        + check_nodes(run, launching=launching)
        + check_data(run)
        + (check_chat_static(run) if is_chat(run) else check_corpus(run) + check_dataset_name(run))
        + check_attention_masks(run)
        + check_peft_static(run)
        + check_tokenizer_fits(run)
        + check_tokenizer_matches(run, notes)
        + check_validation_path(run)
        + check_samples(run)
        + check_probe_length(run)
    )
    if launching:
        problems += check_device_present(run)
        if needs_hub(run) and not problems:
            problems += check_hub_dataset(run)
    if not problems:
        problems += check_chat(run, notes) if is_chat(run) else check_heldout(run, notes)
    problems += check_checkpoint_paths(run) + check_resume_kind(run, run_dir) + check_shard_size(run)
    problems += version_problems
    notes.append("versions:\n" + table)
    problems += check_nki_runtime(run, launching=launching, notes=notes)
    notes.extend(trainium_notes(run) + kernel_notes(run) + device_notes(run))
    if not problems:
        titan_problems, trial = check_titan(run, run_dir)
        problems += titan_problems
        if trial is not None:
            problems += _check_shape(run, trial, notes, run_dir, facts if facts is not None else {})
            problems += check_checkpoint_contents(run, run_dir, trial, notes)
    return problems


def _check_shape(run: RunConf, trial, notes: list[str], run_dir: str, facts: dict) -> list[Problem]:
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
    memory_problems, estimate = check_memory(run, shape)
    notes.append(
        f"device memory per rank (estimate, {shape.params / 1e6:,.1f}M parameters):\n" + estimate.table()
    )
    if run.memory.mode is MemoryMode.trace and not problems:
        return check_trace(run, run_dir, estimate.capacity, notes)
    if estimate.capacity and not memory_problems and estimate.total > 0.9 * estimate.capacity:
        notes.append(
            f"WARNING the memory estimate is {100 * estimate.total / estimate.capacity:.0f}% of a rank's device memory"
        )
    return problems + memory_problems
