"""What the parent and the ranks agree on, and nothing else: the entry points torchrun is given,
the environment a rank reads, the files of a run directory and the readers of those files.

Both sides import this; it imports only the standard library (a rank reads it before torch).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

# torchrun ... -m RANK_ENTRY --module CONFIG_MODULE --config CONFIG_FUNCTION (rank/train.py, rank/titan.py)
RANK_ENTRY = "qwen3_trainium.rank.train"
CONFIG_MODULE = "qwen3_trainium.rank.titan"
CONFIG_FUNCTION = "trainer_config"
RUN_DIR_ENV = "QWEN3_TRAINIUM_RUN_DIR"  # every rank's run directory (absolute path)

# A run directory's files.
JOB_NAME = "job.json"  # how the job went (the parent writes it, the metrics rank reads it)
METRICS_NAME = "metrics.jsonl"  # one row per logged step (the metrics rank writes it)
PROBE_NAME = "export_probe.pt"  # the trained model's logits on a probe batch, beside an HF export


def read_json(path: str) -> dict[str, Any]:
    """A JSON object file, or ``{}`` when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def read_metrics(run_dir: str, *, merge: bool = True) -> list[dict[str, Any]]:
    """Rows of ``metrics.jsonl``; a line still being written is skipped. ``merge=False``: every row
    as written, in order. Otherwise one row per step: a step's rows are merged (eval=on logs ``val_loss`` in a row of its own after the step's training
    row), later values winning: a resumed run's file holds the earlier attempt's rows too, and a
    repeated step keeps its latest values. The one reader of the file (launcher, sweeps, tests,
    benchmarks)."""
    by_step: dict[int, dict[str, Any]] = {}
    written: list[dict[str, Any]] = []
    try:
        with open(os.path.join(run_dir, METRICS_NAME)) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("step"), int):
                    written.append(row)
                    by_step[row["step"]] = by_step.get(row["step"], {}) | row
    except OSError:
        return []
    return [by_step[step] for step in sorted(by_step)] if merge else written


def latest_step(folder: str) -> tuple[int, str] | None:
    """(step, "dcp" | "hf") of the newest step directory torchtitan would resume from."""
    found = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        match = re.fullmatch(r"step-(\d+)", name)
        path = os.path.join(folder, name)
        if match and os.path.isfile(os.path.join(path, ".metadata")):
            found.append((int(match.group(1)), "dcp"))
        elif match and os.path.isfile(os.path.join(path, "model.safetensors.index.json")):
            found.append((int(match.group(1)), "hf"))
    return max(found) if found else None
