"""Weights & Biases through torchtitan's own W&B logger, configured by environment.

torchtitan's ``WandBLogger`` reads ``WANDB_PROJECT``, ``WANDB_RUN_NAME`` and friends from the
environment; ``wandb`` itself reads ``WANDB_MODE``. With no API key (these machines cannot
reach W&B) runs are written offline under the run directory; ``wandb sync`` uploads them.
"""

from __future__ import annotations

from qwen3_trainium.schema import RunConf


def wandb_mode(requested: str, environ: dict[str, str]) -> str:
    if requested != "auto":
        return requested
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if environ.get("WANDB_API_KEY") else "offline"


def wandb_env(run: RunConf, environ: dict[str, str]) -> dict[str, str]:
    if not run.tracking.wandb:
        return {}
    return {
        "WANDB_MODE": wandb_mode(run.tracking.wandb_mode, environ),
        "WANDB_PROJECT": run.tracking.project,
        "WANDB_RUN_NAME": run.run_name,
        "WANDB_SILENT": "true",
    }
