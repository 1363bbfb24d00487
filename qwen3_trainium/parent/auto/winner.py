"""The trace of the layout ``parallel=auto`` chose, kept in the run directory so that pre-flight
checks the winner against it instead of tracing it a second time (``preflight/system.py``)."""

from __future__ import annotations

import json
import os

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent import compose

WINNER_TRACE = os.path.join("auto", "winner_trace.json")


def keep(run: RunConf, run_dir: str, trace: dict) -> None:
    path = os.path.join(run_dir, WINNER_TRACE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"config": compose.to_yaml(run), "trace": trace}, f)


def planned_trace(run: RunConf, run_dir: str) -> dict | None:
    """The winner's trace, where ``run`` is exactly the layout the plan chose, else None."""
    try:
        with open(os.path.join(run_dir, WINNER_TRACE)) as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    return entry["trace"] if entry.get("config") == compose.to_yaml(run) else None
