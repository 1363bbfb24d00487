"""Shared fixtures: compose the real ``conf/`` tree the way ``launch.py`` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from qwen3_trainium import runconfig, schema

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

schema.register()
runconfig.register_resolvers()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """No test may reach the network: the Hub and W&B are switched off."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def compose_cfg(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def resolve(*overrides: str):
    return runconfig.resolve(compose_cfg(*overrides), launch_dir=str(ROOT))


def shipped_options() -> list[tuple[str, str]]:
    return sorted(
        (group.name, yaml.stem) for group in CONF.iterdir() if group.is_dir() for yaml in group.glob("*.yaml")
    )


def run_launch(*args: str, cwd: Path = ROOT, timeout: float = 600, env: dict | None = None):
    """``python launch.py ARGS`` as a user runs it; returns the CompletedProcess."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
