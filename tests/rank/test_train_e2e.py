"""Real torchtitan training through launch.py -> torchrun on CPU: 1 rank and 2 ranks."""

from __future__ import annotations

import pytest
from conftest import read_metrics, run_launch

pytestmark = pytest.mark.slow


def _metrics(run_dir) -> list[dict]:
    return read_metrics(run_dir)


def test_smoke_one_rank_trains_ten_steps_with_falling_loss_and_offline_wandb(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_launch("model=native", "smoke=on", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert all(r["tokens_per_second"] > 0 and r["memory_max_active_gib"] > 0 for r in rows)
    assert (run_dir / "resolved.yaml").is_file()
    offline_runs = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(offline_runs) == 1


def test_smoke_two_ranks_fsdp_on_gloo(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_launch("model=native", "smoke=on", "parallel=cpu2", "tracking=off", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _metrics(run_dir)
    assert len(rows) == 10 and rows[-1]["loss"] < rows[0]["loss"]
    assert all(r["memory_max_all_ranks_gib"] > 0 and r["memory_capacity_gib"] > 0 for r in rows)
    assert all("mfu_pct" not in r for r in rows)  # n/a on CPU
    logs = sorted(run_dir.glob("logs/*/attempt_0/*/stdout.log"))
    assert len(logs) == 2  # both ranks ran
    last = [next(line for line in reversed(p.read_text().splitlines()) if "step: 10" in line) for p in logs]
    assert all("loss:" in line for line in last)
    losses = {line.split("loss:")[1].split()[0] for line in last}
    assert len(losses) == 1  # identical global loss on both ranks


def test_failed_training_returns_torchruns_exit_status(tmp_path):
    # A data directory whose records are not JSON: only the rank's dataset loader can tell.
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("this is not json\n")
    proc = run_launch(
        "smoke=on",
        "tracking=off",
        "data=local",
        f"data.dataset_path={data}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert proc.returncode != 0
