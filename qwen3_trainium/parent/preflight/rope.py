"""Pre-flight for the model's rotary embedding: ``training.seq_len`` against the checkpoint's
``max_position_embeddings`` and ``model.rope_scaling`` (YaRN), before any process starts."""

from __future__ import annotations

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight.problem import Problem


def check_rope(run: RunConf) -> list[Problem]:
    return []
