"""Keys of the composed config that the schema does not have.

Hydra refuses a misspelt key (``training.stepz=3``), but ``+training.stepz=3`` is added with
``OmegaConf.update(..., force_add=True)`` (hydra/_internal/config_loader_impl.py,
``_apply_overrides_to_config``: "Could not append to config" is raised only when the key
exists), which adds it even to a typed group, and the run would train with the default. Every group here is typed, so any such key is refused, naming the
nearest valid spelling. The open hatches are lists, not keys: ``override.imports`` (extra
torchtitan ``@override`` factories) and ``tracking.tags``.
"""

from __future__ import annotations

import dataclasses
import difflib

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight.problem import Problem


def unknown_keys(cfg) -> list[Problem]:
    """Every key of ``cfg`` (a composed DictConfig) that ``RunConf`` lacks, with its nearest spelling."""
    return _walk(cfg, RunConf, "")


def _walk(node, schema: type, prefix: str) -> list[Problem]:
    from omegaconf import DictConfig

    known = {f.name: f for f in dataclasses.fields(schema)}
    problems = []
    for key in node.keys():
        full = f"{prefix}{key}"
        if key not in known:
            problems.append(_unknown(node, key, full, sorted(known), prefix))
            continue
        child_type = known[key].type
        child = node._get_node(key)
        if isinstance(child, DictConfig) and dataclasses.is_dataclass(child_type):
            problems += _walk(child, child_type, f"{full}.")
    return problems


def _unknown(node, key: str, full: str, known: list[str], prefix: str) -> Problem:
    from omegaconf import OmegaConf

    value = OmegaConf.to_container(node, resolve=False)[key]
    section = prefix.rstrip(".") or "the config"
    near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    if near:
        fix = f"{prefix}{near[0]}={_shown(value)} (no +: the key exists)"
    else:
        fix = f"drop +{full}; {section} has: {', '.join(known)}"
    return Problem(full, value, f"{section} has no key {key!r} (added with +, it would be ignored)", fix)


def _shown(value) -> str:
    return value if isinstance(value, str) else repr(value)
