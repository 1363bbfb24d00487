"""Who a run is to the trackers: W&B mode, a stable run id, group (the sweep), tags, and the
versions and git commit recorded in its summary. Parent side, before launch.

The rank side (``metrics.WandbRunLogger``) reads all of it from the run directory: the
identity from ``resolved.yaml``, the versions and commit from ``job.json``. With no API key
(these machines cannot reach W&B) runs are written offline under ``<run_dir>/wandb``;
``make wandb-sync`` uploads them later.
"""

from __future__ import annotations

import os
import secrets
import string
import subprocess
from pathlib import Path

from qwen3_trainium.config.schema import RunConf

RUN_ID_NAME = "wandb_run_id"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
TAGGED_CHOICES = ("parallel",)  # Hydra group choices that become tags, beside model: and device:


def wandb_mode(requested: str, environ: dict[str, str]) -> str:
    if requested != "auto":
        return requested
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if environ.get("WANDB_API_KEY") else "offline"


def wandb_env(run: RunConf, environ: dict[str, str]) -> dict[str, str]:
    if not run.tracking.wandb:
        return {}
    return {"WANDB_MODE": wandb_mode(run.tracking.wandb_mode.value, environ), "WANDB_SILENT": "true"}


def stable_run_id(run_dir: str, *, create: bool) -> str:
    """The run directory's W&B id: read from ``wandb_run_id``, else made (and kept if ``create``).

    The same command with ``checkpoint=resume`` reuses its run directory, so the resumed run
    logs into the same W&B run instead of starting a second one."""
    path = os.path.join(run_dir, RUN_ID_NAME)
    if os.path.isfile(path):
        with open(path) as f:
            kept = f.read().strip()
        if kept:
            return kept
    alphabet = string.ascii_lowercase + string.digits
    run_id = "".join(secrets.choice(alphabet) for _ in range(8))
    if create:
        os.makedirs(run_dir, exist_ok=True)
        with open(path, "w") as f:
            f.write(run_id + "\n")
    return run_id


def sweep_id(sweep_dir: str) -> str:
    """A multirun's id: its directory's last two parts (``runs/multirun/<date>/<time>``)."""
    parts = Path(sweep_dir).resolve().parts
    return "sweep-" + "_".join(parts[-2:])


def tags(run: RunConf, choices: dict[str, str]) -> list[str]:
    auto = [f"model:{run.model.path.value}", f"device:{run.device.type.value}"]
    auto += [f"{group}:{choices[group]}" for group in TAGGED_CHOICES if choices.get(group)]
    return auto + [tag for tag in run.tracking.tags if tag not in auto]


def fill_identity(
    run: RunConf, run_dir: str, *, choices: dict[str, str], sweep_dir: str | None, create: bool
) -> None:
    """Fill ``tracking.run_id``, ``group`` and ``tags`` (what the user left empty)."""
    track = run.tracking
    track.run_id = track.run_id or stable_run_id(run_dir, create=create)
    track.group = track.group or (sweep_id(sweep_dir) if sweep_dir else "")
    track.tags = tags(run, choices)


def git_commit(root: Path = PROJECT_ROOT) -> str:
    """HEAD of the project's checkout, ``-dirty`` when it has uncommitted changes; '' outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
