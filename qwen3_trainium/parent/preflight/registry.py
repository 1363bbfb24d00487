"""Every pre-flight check of a config, declared once, in the order its problems are reported,
with the tiers it runs in. The quick tier (``check_static``: neither torch nor torchtitan, before
any process starts) and the full tier (``check``: everything) are both read from ``CHECKS``, so a
check cannot be in one list and missing from the other.

A check with a ``quick`` form is in both tiers (the quick form may be a lighter one: the model's
config values against its full build); one without is in the full tier only. ``when`` and
``stops`` order the full tier: a check that needs the ones before it to have passed (the data read
through, torchtitan's own validation) runs only then, and a failed seam or model ends the pass,
since every later check builds on them. The quick tier runs all of its checks, always.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight import (
    chat,
    checkpoint,
    context,
    data,
    dpo,
    dpo_reference,
    heldout,
    model,
    moe,
    passkey,
    peft,
    ranges,
    rope,
    shape,
    stack,
)
from qwen3_trainium.parent.preflight import run as runs
from qwen3_trainium.parent.preflight.problem import Problem


@dataclass
class Pass:
    """One run of a tier: what every check reads, and what it leaves for the next ones."""

    run: RunConf
    run_dir: str
    launching: bool
    notes: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    versions: tuple[list[Problem], str] = field(
        default_factory=lambda: ([], "")
    )  # full tier: the installed stack's (problems, table)


Step = Callable[[Pass], list[Problem]]


@dataclass(frozen=True)
class Check:
    name: str
    full: Step
    quick: Step | None = None  # None: the full tier only
    when: Callable[[Pass], bool] = lambda p: True  # full tier: whether it runs, given the pass so far
    stops: bool = False  # full tier: with any problem so far, the pass ends after this check


def both(name: str, step: Step) -> Check:
    return Check(name, full=step, quick=step)


def _clean(p: Pass) -> bool:
    return not p.problems


def _of_run(check: Callable[[RunConf], list[Problem]]) -> Step:
    return lambda p: check(p.run)


def _seams(p: Pass) -> list[Problem]:
    problems = stack.check_seams(p.run)  # first: every check after it imports torchtitan
    return problems + p.versions[0] if problems else []


def _records(p: Pass) -> list[Problem]:
    return chat.check_chat_static(p.run) if chat.is_chat(p.run) else data.check_corpus(p.run)


def _data_read(p: Pass) -> list[Problem]:
    return chat.check_chat(p.run, p.notes) if chat.is_chat(p.run) else heldout.check_heldout(p.run, p.notes)


def _versions(p: Pass) -> list[Problem]:
    p.notes.append("versions:\n" + p.versions[1])
    return p.versions[0]


def _notes(p: Pass) -> list[Problem]:
    p.notes.extend(stack.trainium_notes(p.run) + model.kernel_notes(p.run) + runs.device_notes(p.run))
    return []


CHECKS: tuple[Check, ...] = (
    Check("seams", full=_seams, stops=True),
    both("device", _of_run(runs.check_device)),
    Check("model", full=_of_run(model.check_model), quick=_of_run(model.check_model_static), stops=True),
    both("attention", _of_run(runs.check_attention)),
    both("compile", _of_run(runs.check_compile)),
    both("ranges", _of_run(ranges.check_ranges)),
    both("rope", _of_run(rope.check_rope)),
    both("context parallel", _of_run(context.check_context_parallel)),
    both("override imports", _of_run(runs.check_override_imports)),
    both("world size", _of_run(runs.check_world_size)),
    both("nodes", lambda p: runs.check_nodes(p.run, launching=p.launching)),
    both("data", _of_run(data.check_data)),
    both("objective", _of_run(dpo.check_dpo)),
    both("records", _records),
    Check("dataset name", full=_of_run(data.check_dataset_name), when=lambda p: not chat.is_chat(p.run)),
    both("attention masks", _of_run(chat.check_attention_masks)),
    both("peft", _of_run(peft.check_peft_static)),
    both("moe balance", _of_run(moe.check_balance)),
    Check("tokenizer fits", full=_of_run(data.check_tokenizer_fits)),
    Check("tokenizer matches", full=lambda p: data.check_tokenizer_matches(p.run, p.notes)),
    both("validation path", _of_run(heldout.check_validation_path)),
    both("samples", _of_run(heldout.check_samples)),
    both("long context", _of_run(passkey.check_long_context)),
    both("probe length", _of_run(heldout.check_probe_length)),
    both("probe precision", _of_run(heldout.check_probe_precision)),
    Check("device present", full=_of_run(runs.check_device_present), when=lambda p: p.launching),
    Check(
        "hub dataset",
        full=_of_run(data.check_hub_dataset),
        when=lambda p: p.launching and data.needs_hub(p.run) and _clean(p),
    ),
    Check("data read", full=_data_read, when=_clean),
    both("checkpoint paths", _of_run(checkpoint.check_checkpoint_paths)),
    both("resume kind", lambda p: checkpoint.check_resume_kind(p.run, p.run_dir)),
    both("dpo reference", lambda p: dpo_reference.check_reference_on_resume(p.run, p.run_dir)),
    both("shard size", _of_run(checkpoint.check_shard_size)),
    Check("versions", full=_versions),
    Check("nki runtime", full=lambda p: stack.check_nki_runtime(p.run, launching=p.launching, notes=p.notes)),
    Check(
        "neuron release",
        full=lambda p: stack.check_neuron_release(p.run, p.notes),
    ),
    Check("notes", full=_notes),
    Check("torchtitan", full=lambda p: shape.check_built(p.run, p.run_dir, p.notes, p.facts), when=_clean),
)


def quick(run_conf: RunConf, run_dir: str, *, launching: bool) -> list[Problem]:
    """The quick tier: every check with a quick form, in order, all of them."""
    p = Pass(run_conf, run_dir, launching)
    for check in CHECKS:
        if check.quick is not None:
            p.problems += check.quick(p)
    return p.problems


def full(p: Pass) -> list[Problem]:
    """The full tier: every check, in order, as ``when`` and ``stops`` allow."""
    for check in CHECKS:
        if not check.when(p):
            continue
        p.problems += check.full(p)
        if check.stops and p.problems:
            break
    return p.problems
