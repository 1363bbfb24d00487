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
from torchtitan.tools.logging import logger

from qwen3_trainium.rank import hbm_watch

VAL_PREFIX = "validation_metrics/"
VAL_PERPLEXITY = VAL_PREFIX + "perplexity"

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
    "memory/max_reserved_all_ranks(GiB)": "memory_max_all_ranks_gib",
    "memory/capacity(GiB)": "memory_capacity_gib",
    hbm_watch.DRIVER_TOTAL: "neuron_driver_total_gib",
    hbm_watch.DRIVER_PEAK: "neuron_driver_peak_gib",
    hbm_watch.ACCELERATOR_ALLOCATED: "accelerator_peak_allocated_gib",
    hbm_watch.ACCELERATOR_RESERVED: "accelerator_peak_reserved_gib",
    hbm_watch.WATCHED_PEAK: "watched_peak_gib",
    hbm_watch.WATCHED_FROM_ACCELERATOR: "watched_from_accelerator",
    # eval=on: torchtitan's Validator (log_validation), at the eval steps
    "validation_metrics/loss": "val_loss",
    VAL_PERPLEXITY: "val_perplexity",
}
# eval.long_context: rank/passkey.py's figures, "passkey/accuracy" -> "passkey_accuracy",
# "passkey/depth_0.5" -> "passkey_depth_0.5", logged once after the last step
PASSKEY_PREFIX = "passkey/"
# MoE figures of the trainer's extra sources (rank/moe_balance.py, rank/expert_load.py):
# "moe/aux_loss" -> "moe_aux_loss", "moe/load_max_over_mean" -> "moe_load_max_over_mean"
MOE_PREFIX = "moe/"
# objective=dpo (rank/dpo.py): TRL's names, "rewards/chosen" -> "rewards_chosen", "logps/rejected"
# -> "logps_rejected"; W&B and TensorBoard receive TRL's names as they are
DPO_PREFIXES = ("rewards/", "logps/")
WARN_FRACTION = 0.9


def jsonl_key(key: str) -> str | None:
    """The metrics.jsonl name of a torchtitan metric key, or None when it is not written."""
    if key.startswith(PASSKEY_PREFIX):
        return "passkey_" + key.removeprefix(PASSKEY_PREFIX)
    if key.startswith(MOE_PREFIX):
        return "moe_" + key.removeprefix(MOE_PREFIX)
    if key.startswith(DPO_PREFIXES):
        return key.replace("/", "_", 1)
    held_out = key.removeprefix(VAL_PREFIX)
    if held_out != key and held_out.startswith(DPO_PREFIXES):  # eval=on, rank/dpo_validator.py
        return "val_" + held_out.replace("/", "_", 1)
    return JSONL_KEYS.get(key)


class JsonlLogger(BaseLogger):
    def __init__(self, path: str, *, report_mfu: bool) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._file = open(path, "a", buffering=1)
        self._report_mfu = report_mfu

    def log(self, metrics: dict[str, Any], step: int) -> None:
        row: dict[str, Any] = {"step": step, "time": time.time()}
        for key in metrics:
            name = jsonl_key(key)
            if name is None or (name == "mfu_pct" and not self._report_mfu):
                continue
            value = metrics[key]
            row[name] = float(value) if isinstance(value, (int, float)) else value
            if isinstance(row[name], float) and not math.isfinite(row[name]):
                row[name] = str(row[name])
        self._file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self._file.close()


class WandbRunLogger(BaseLogger):
    """One W&B run per run directory: the resolved config (every group) as its config, name,
    stable id, group and tags from ``resolved.yaml``, the versions and git commit of
    ``job.json`` in its summary. ``resume="allow"``: a resumed run continues its history."""

    def __init__(self, run_dir: str) -> None:
        import wandb
        import yaml

        from qwen3_trainium.config import runconfig
        from qwen3_trainium.shared import contract

        path = os.path.join(run_dir, runconfig.RESOLVED_NAME)
        run = runconfig.load(path)
        with open(path) as f:
            config = yaml.safe_load(f)  # every group, enums by name: what OmegaConf wrote
        job = contract.read_json(os.path.join(run_dir, contract.JOB_NAME))
        track = run.tracking
        self._run = wandb.init(
            project=track.project,
            name=run.run_name,
            id=track.run_id or None,
            group=track.group or None,
            tags=track.tags,
            config=config,
            dir=run_dir,
            resume="allow",
        )
        self._run.summary.update(
            {"versions": job.get("versions", {}), "git_commit": job.get("git_commit", "")}
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class JsonlMetricsProcessor(MetricsProcessor):
    """torchtitan's metrics processor plus ``metrics.jsonl`` on the metrics rank."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        jsonl_path: str = ""
        """Where to write metrics.jsonl; empty disables it."""

        report_mfu: bool = True
        """False where torchtitan's peak-FLOPS table has no entry (CPU): MFU is n/a."""

        peak_flops_per_rank: float = 0.0
        """BF16 peak of one rank for MFU, from this project's device table (Neuron: per logical
        core at the LNC in use); 0 keeps torchtitan's own table (CUDA)."""

        memory_capacity_gib: float = 0.0
        """Device memory per rank; above 90% of it a warning is logged once (0: unknown)."""

        wandb_run_dir: str = ""
        """Log to W&B as the run of this directory (``WandbRunLogger``); empty: no W&B."""

    def __init__(self, config: Config, **kwargs):
        super().__init__(config, **kwargs)
        if not config.report_mfu:
            self.has_quantization = True  # torchtitan's own switch for "MFU: N/A"
        if config.peak_flops_per_rank > 0:
            # torchtitan's table has one trn2 figure (2 x 79 TFLOPS) whatever the LNC; ours is 79 per
            # physical core times the LNC in use (config/devices.py), equal to torchtitan's at LNC=2.
            self.gpu_peak_flops = config.peak_flops_per_rank
        self._warned_memory = False
        self._noted_watch = False
        # callables(step) -> {metric key: value}, run on every rank at each log step (they may
        # hold collectives): the trainer's MoE figures (rank/moe_balance.py, rank/expert_load.py)
        self.extra_sources: list = []

    def _watch_hbm(self) -> dict[str, float]:
        """This rank's HBM figures on Neuron; says once which source the watched peak comes from."""
        lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))
        figures, why = hbm_watch.hbm_watch(int(os.environ.get("LOCAL_RANK", "0")), lnc)
        if not self._noted_watch:  # once: the source does not change within a run
            self._noted_watch = True
            watched = hbm_watch.WATCHED_PEAK in figures
            (logger.info if watched else logger.warning)(f"HBM watch: {hbm_watch.source_line(figures, why)}")
        return figures

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        """torchtitan's log, plus the peak memory of the fullest rank (a MAX all-reduce)."""
        from torchtitan.tools import utils

        peak = self.device_memory_monitor.get_peak_stats().max_reserved_gib
        if torch.distributed.is_initialized():
            value = torch.tensor([peak], dtype=torch.float64, device=utils.device_type)
            torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
            peak = float(value.item())
        extra = dict(extra_metrics or {})
        for source in self.extra_sources:
            extra.update(source(step))
        extra["memory/max_reserved_all_ranks(GiB)"] = peak
        if utils.device_type == "neuron":
            extra.update(self._watch_hbm())
        capacity = self.config.memory_capacity_gib
        if capacity:
            extra["memory/capacity(GiB)"] = capacity
            if peak > WARN_FRACTION * capacity and not self._warned_memory:
                self._warned_memory = True
                logger.warning(
                    f"device memory: a rank peaked at {peak:.2f} GiB, over 90% of its {capacity:.2f} GiB"
                )
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)

    def log_validation(self, loss: float, step: int, extra_metrics=None):
        """torchtitan's, plus the held-out perplexity: exp of the mean token loss (capped where
        exp overflows a float). Not for objective=dpo, whose held-out loss is the DPO loss
        (its TRL metrics ride along instead): exp of it means nothing."""
        extra = dict(extra_metrics or {})
        if not any(jsonl_key(k) and jsonl_key(k).startswith("val_rewards_") for k in extra):
            extra[VAL_PERPLEXITY] = math.exp(min(float(loss), 700.0))
        super().log_validation(loss=loss, step=step, extra_metrics=extra)

    def log_passkey(self, figures: dict[str, float], step: int) -> None:
        """eval.long_context's accuracy (``passkey.metrics``) to every logger, at the last step."""
        self.logger.log(dict(figures), step)
        logger.info(
            "passkey: " + ", ".join(f"{k.removeprefix(PASSKEY_PREFIX)} {v:.2f}" for k, v in figures.items())
        )

    def _build_metric_logger(self, *, config: Config, parallel_dims, pp_schedule: str, **kw):
        base = super()._build_metric_logger(
            config=config, parallel_dims=parallel_dims, pp_schedule=pp_schedule, **kw
        )
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        metrics_rank = _get_metrics_rank(parallel_dims=parallel_dims, pp_schedule=pp_schedule)
        if rank != metrics_rank or not (config.jsonl_path or config.wandb_run_dir):
            return base
        container = base if isinstance(base, LoggerContainer) else LoggerContainer()
        if config.jsonl_path:
            container.add_logger(JsonlLogger(config.jsonl_path, report_mfu=config.report_mfu))
        if config.wandb_run_dir:
            try:
                container.add_logger(WandbRunLogger(config.wandb_run_dir))
            except Exception as e:  # like torchtitan's: a tracker that fails must not stop training
                logger.warning(f"W&B logging is off for this run: {type(e).__name__}: {e}")
        return container
