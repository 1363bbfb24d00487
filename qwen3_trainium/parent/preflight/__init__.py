"""Every check that can fail before a process starts, reported all together.

Each problem names the config key, the bad value and the fix. ``check`` never raises for a
user error: it returns the list, and the launcher prints it and exits non-zero.

Two tiers: ``check_static`` needs neither torch nor torchtitan (the config's own values, paths,
the world size); ``check`` is everything, including torchtitan's validation of the translated
``Trainer.Config`` and the model built on the meta device. The launcher runs ``check_static``
before any process starts and ``check`` either before (a dry run, a static problem) or while the
ranks import torch, which wait for its verdict before touching a device (``gate.py``). Both tiers
are read from one list, ``registry.CHECKS``: each check declared once, in order, with its tiers.
"""

from __future__ import annotations

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight import registry
from qwen3_trainium.parent.preflight.files import check_inputs, check_load_step, check_writable
from qwen3_trainium.parent.preflight.host import check_disk, check_host, check_trackers
from qwen3_trainium.parent.preflight.keys import unknown_keys
from qwen3_trainium.parent.preflight.problem import Problem, format_problems
from qwen3_trainium.parent.preflight.ranges import check_ranges
from qwen3_trainium.parent.preflight.run import check_nodes
from qwen3_trainium.parent.preflight.stack import installed_versions, versions

__all__ = [
    "Problem",
    "check",
    "check_disk",
    "check_machine",
    "check_nodes",
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
    """The checks that import neither torch nor torchtitan (milliseconds): the quick tier of
    ``registry.CHECKS``, each of which the full tier runs too."""
    return registry.quick(run, run_dir, launching=launching)


def check(
    run: RunConf, run_dir: str, *, launching: bool, notes: list[str] | None = None, facts: dict | None = None
) -> list[Problem]:
    """All problems of a resolved run config (the full tier of ``registry.CHECKS``); lines worth
    printing when all is well go to ``notes``, what later checks reuse (the model's parameter
    counts) to ``facts``."""
    notes = notes if notes is not None else []
    facts = facts if facts is not None else {}
    stack_versions = versions(run, launching=launching)
    return registry.full(registry.Pass(run, run_dir, launching, notes, facts, versions=stack_versions))
