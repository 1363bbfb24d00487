"""Pre-flight for context parallel (``parallel.context_parallel_degree``): which paths and
attention backends can shard the sequence, and the lengths that divide, before any process starts."""

from __future__ import annotations

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight.problem import Problem


def check_context_parallel(run: RunConf) -> list[Problem]:
    return []
