"""``metrics.jsonl``: one JSON object per logged step, written by the metrics rank.

A ``MetricsProcessor`` subclass (torchtitan's own extension point) that adds a JSONL
logger beside W&B / TensorBoard. The file is what the launcher, the tests, the benchmarks and
sweep summaries read; it does not depend on any tracking service.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.metrics import (
    BaseLogger,
    LoggerContainer,
    MetricsProcessor,
    _get_metrics_rank,
)

# torchtitan metric key -> metrics.jsonl key
JSONL_KEYS = {
    "loss_metrics/global_avg_loss": "loss",
    "loss_metrics/global_max_loss": "max_loss",
    "grad_norm": "grad_norm",
    "throughput(tps)": "tokens_per_second",
    "tflops": "tflops",
    "mfu(%)": "mfu_pct",
    "time_metrics/end_to_end(s)": "step_time_s",
    "memory/max_active(GiB)": "memory_max_active_gib",
    "memory/max_reserved(GiB)": "memory_max_reserved_gib",
    "n_tokens_seen": "tokens_seen",
}


class JsonlLogger(BaseLogger):
    def __init__(self, path: str, *, report_mfu: bool) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._file = open(path, "a", buffering=1)
        self._report_mfu = report_mfu

    def log(self, metrics: dict[str, Any], step: int) -> None:
        row: dict[str, Any] = {"step": step, "time": time.time()}
        for key, name in JSONL_KEYS.items():
            if key not in metrics or (name == "mfu_pct" and not self._report_mfu):
                continue
            value = metrics[key]
            row[name] = float(value) if isinstance(value, (int, float)) else value
            if isinstance(row[name], float) and not math.isfinite(row[name]):
                row[name] = str(row[name])
        self._file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self._file.close()


class JsonlMetricsProcessor(MetricsProcessor):
    """torchtitan's metrics processor plus ``metrics.jsonl`` on the metrics rank."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        jsonl_path: str = ""
        """Where to write metrics.jsonl; empty disables it."""

        report_mfu: bool = True
        """False where torchtitan's peak-FLOPS table has no entry (CPU): MFU is omitted."""

    def _build_metric_logger(self, *, config: Config, parallel_dims, pp_schedule: str, **kw):
        base = super()._build_metric_logger(
            config=config, parallel_dims=parallel_dims, pp_schedule=pp_schedule, **kw
        )
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        metrics_rank = _get_metrics_rank(parallel_dims=parallel_dims, pp_schedule=pp_schedule)
        if not config.jsonl_path or rank != metrics_rank:
            return base
        container = base if isinstance(base, LoggerContainer) else LoggerContainer()
        container.add_logger(JsonlLogger(config.jsonl_path, report_mfu=config.report_mfu))
        return container
