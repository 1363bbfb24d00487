"""Pre-flight for the model's rotary embedding: ``training.seq_len`` against the checkpoint's
``max_position_embeddings`` and ``model.rope_scaling`` (YaRN), before any process starts.

Standard library only (both tiers): the RoPE is resolved by ``config/rope.py`` from the run config,
the HF checkpoint's ``config.json`` and the flavor's table (docs/long_context.md).
"""

from __future__ import annotations

import math

from qwen3_trainium.config import flavors, rope
from qwen3_trainium.config.schema import ModelPath, RunConf
from qwen3_trainium.parent.preflight.problem import Problem

KEY = "model.rope_scaling"
QWEN_YARN = (
    f"{KEY}.rope_type=yarn {KEY}.factor=4.0 {KEY}.original_max_position_embeddings=32768 "
    "(Qwen3's documented YaRN to 131,072 tokens)"
)
TRAINED = ("default", rope.YARN)  # what the native paths build (models/yarn.py)


def check_rope(run: RunConf) -> list[Problem]:
    if run.model.max_position_embeddings == 0 or run.model.max_position_embeddings < -1:
        fix = "model.max_position_embeddings=-1 (the checkpoint's, else the flavor's) or a positive length"
        value = run.model.max_position_embeddings
        return [Problem("model.max_position_embeddings", value, "is neither -1 nor a length", fix)]
    directory = rope.source_dir(run)
    source = rope.read_config(directory)
    if run.model.path is ModelPath.hf and source is None:
        return []  # the model check names the missing directory
    where = f"{directory}/config.json" if source else f"model.flavor={run.model.flavor}"
    problems = _conflicts(run, source, where) + _unset_type(run, source)
    if problems:
        return problems
    resolved = rope.resolve(run.model, source, flavors.rope_table(run.model.flavor))
    if resolved.rope_type not in TRAINED and run.model.path is not ModelPath.hf:
        what = "RoPE scaling this project's Qwen3 cannot build (it builds default RoPE and YaRN)"
        fix = f"{KEY}.rope_type=default, or model=hf model.hf_model={directory} (Transformers' own)"
        return [Problem(f"{where}: rope_type", resolved.rope_type, what, fix)]
    problems = _yarn_values(resolved, where) if resolved.yarn else []
    return problems or _length(run, resolved, where)


def _conflicts(run: RunConf, source: dict | None, where: str) -> list[Problem]:
    """An explicit setting that contradicts the checkpoint's own non-default RoPE scaling."""
    return [
        Problem(
            f"{KEY}.{key}",
            mine,
            f"{where} has rope_scaling {key}={theirs}: the run and the checkpoint disagree",
            f"leave {KEY}.{key} unset (the checkpoint's own), or start from a checkpoint without RoPE scaling",
        )
        for key, mine, theirs in rope.conflicts(run.model.rope_scaling, source)
    ]


def _unset_type(run: RunConf, source: dict | None) -> list[Problem]:
    """YaRN values with no YaRN: a factor set on a default-RoPE model would change nothing."""
    conf = run.model.rope_scaling
    own = rope.checkpoint_rope(source)["rope_type"] if source else "default"
    effective = own if conf.rope_type.value == "auto" else conf.rope_type.value
    set_keys = rope.explicit(conf)
    if effective == rope.YARN or not set_keys:
        return []
    key = next(iter(set_keys))
    message = f"YaRN's {key} is set but the RoPE is {effective}: it would change nothing"
    return [
        Problem(f"{KEY}.{key}", set_keys[key], message, f"{KEY}.rope_type=yarn, or leave {KEY}.{key} unset")
    ]


def _yarn_values(resolved: rope.Rope, where: str) -> list[Problem]:
    """Transformers' required yarn keys (``_validate_yarn_rope_parameters``) and sane values."""
    problems = []
    factor, original = resolved.factor, resolved.original_max_position_embeddings
    if factor is None or factor <= 1:
        problems.append(
            Problem(f"{KEY}.factor", factor, "YaRN stretches RoPE by a factor above 1", QWEN_YARN)
        )
    if original is None or original <= 0:
        message = (
            "YaRN needs the context the model was pretrained at; Transformers would silently take "
            "max_position_embeddings (40960 for Qwen3), not Qwen3's 32768"
        )
        problems.append(Problem(f"{KEY}.original_max_position_embeddings", original, message, QWEN_YARN))
    for key in ("attention_factor", "beta_fast", "beta_slow"):
        value = getattr(resolved, key)
        if value is not None and value <= 0:
            fix = f"leave {KEY}.{key} unset (Transformers' default) or a positive value"
            problems.append(Problem(f"{KEY}.{key}", value, "must be positive", fix))
    return problems


def _length(run: RunConf, resolved: rope.Rope, where: str) -> list[Problem]:
    seq, limit = run.training.seq_len, resolved.max_position_embeddings
    if seq <= limit:
        return []
    message = f"longer than the model's {limit} positions (max_position_embeddings, {where})"
    if resolved.yarn:
        original = resolved.original_max_position_embeddings
        need = math.ceil(seq / original)
        fix = (
            f"{KEY}.factor={need}.0 model.max_position_embeddings={need * original} (YaRN reaches "
            f"original_max_position_embeddings x factor), or training.seq_len<={limit}"
        )
    else:
        need = math.ceil(seq / rope.QWEN3_ORIGINAL)
        fix = (
            f"{KEY}.rope_type=yarn {KEY}.factor={max(need, 2)}.0 "
            f"{KEY}.original_max_position_embeddings={rope.QWEN3_ORIGINAL} (Qwen3's YaRN), "
            f"or training.seq_len<={limit}"
        )
    return [Problem("training.seq_len", seq, message, fix)]
