"""``python launch.py`` as a user types it: dry runs and bad input, no process started."""

from __future__ import annotations

import pytest
from conftest import run_launch


def test_dry_run_prints_the_torchrun_command_and_starts_nothing(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_launch("model=native", "smoke=on", "dry_run=true", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr
    assert "--nproc_per_node=1" in proc.stdout
    assert "--rdzv_endpoint localhost:0" in proc.stdout
    assert "QWEN3_TRAINIUM_RUN_DIR=" in proc.stdout
    assert "flavor: tiny" in proc.stdout
    assert not (run_dir / "resolved.yaml").exists()
    assert not (run_dir / "logs").exists()


def test_dry_run_of_the_trn2_layout_validates_here(tmp_path):
    proc = run_launch("parallel=trn2_dp64", "dry_run=true", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "--nproc_per_node=64" in proc.stdout
    assert "NEURON_LOGICAL_NC_CONFIG=2" in proc.stdout


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model=nativ", "Could not find 'model/nativ'"),
        ("training.stepz=3", "Key 'stepz' not in 'TrainingConf'"),
        ("training.steps=ten", "training.steps"),
    ],
)
def test_typos_fail_fast_without_a_traceback(override, expected, tmp_path):
    proc = run_launch(override, f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_preflight_errors_exit_2_with_key_value_and_fix(tmp_path):
    proc = run_launch(
        "device=cpu", "model.attn_backend=flex", "training.steps=0", f"hydra.run.dir={tmp_path}"
    )
    assert proc.returncode == 2
    assert "model.attn_backend = 'flex'" in proc.stderr
    assert "training.steps = 0" in proc.stderr
    assert "fix: model.attn_backend=sdpa" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_missing_required_value_names_the_key(tmp_path):
    proc = run_launch("data=local", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert "data.dataset_path" in proc.stderr and "Traceback" not in proc.stderr


def test_hf_hub_id_missing_offline_fails_before_launch_with_the_download_command(tmp_path):
    proc = run_launch(
        "model=hf", "model.hf_model=Qwen/Qwen3-4B-Instruct-2507", "smoke=on", f"hydra.run.dir={tmp_path}"
    )
    assert proc.returncode == 2
    assert "hf download Qwen/Qwen3-4B-Instruct-2507 --local-dir" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "logs").exists()
