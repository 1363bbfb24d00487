"""``hydra/launcher=submitit_slurm`` against a real Slurm: two slurmd nodes on this machine
(``tests/slurm/start_cluster.sh``), one Slurm job per sweep job, one torchrun per node."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_launch

pytestmark = pytest.mark.slow
SLURM_DIR = Path("/tmp/q3t-slurm-tests")


@pytest.fixture(scope="module")
def slurm_env():
    env = {**os.environ, "SLURM_TEST_DIR": str(SLURM_DIR)}
    start = subprocess.run(
        ["bash", str(ROOT / "tests/slurm/start_cluster.sh")], env=env, capture_output=True, text=True
    )
    assert start.returncode == 0, start.stdout[-3000:] + start.stderr[-3000:]
    # submitit polls sacct; without slurmdbd the cluster's shim reads the job-completion log
    yield {"SLURM_CONF": str(SLURM_DIR / "slurm.conf"), "PATH": f"{SLURM_DIR / 'bin'}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(ROOT / "tests/slurm/stop_cluster.sh")], env=env, check=False)


def test_sweep_submitted_to_slurm_trains_on_two_nodes_per_job(tmp_path, slurm_env):
    sweep_dir = tmp_path / "sweep"
    proc = run_launch(
        "-m", "cluster=slurm_local", "launcher.nnodes=2", "launcher.nproc_per_node=1", "model=native,nki_moe",
        "smoke=on", "training.steps=3", "tracking=off", f"hydra.sweep.dir={sweep_dir}",
        env=slurm_env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(sweep_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "ok"] and all(r["steps"] == "3/3" for r in rows)
    assert all(float(r["final_loss"]) < float(r["first_loss"]) for r in rows)
    for row in rows:
        run_dir = Path(row["run_dir"])
        assert (run_dir / "resolved.yaml").is_file() and (run_dir / "resolved.node1.yaml").is_file()
        assert len(list(run_dir.glob("logs/*/attempt_0/0/stdout.log"))) == 2  # a torchrun on each node
    task_logs = sorted(sweep_dir.glob(".submitit/*/*_log.out"))
    assert len(task_logs) == 4  # 2 Slurm jobs x 2 tasks (one per node)
    assert all("--nnodes=2" in p.read_text() for p in task_logs)


def test_dry_run_prints_the_sbatch_script_and_each_nodes_torchrun_line(tmp_path):
    proc = run_launch(
        "hydra/launcher=submitit_slurm", "cluster=slurm_trn2", "launcher.nnodes=4", "model=native", "model.flavor=8B",
        "dry_run=true", f"hydra.sweep.dir={tmp_path}", "-m",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "#SBATCH --nodes=4" in proc.stdout and "#SBATCH --ntasks-per-node=1" in proc.stdout
    assert "# torchrun command (on each of the 4 nodes" in proc.stdout
    assert (
        "--nnodes=4 --nproc_per_node=64 --rdzv_backend c10d --rdzv_endpoint '<head node>:29500'"
        in proc.stdout
    )
    assert "FI_PROVIDER=efa" in proc.stdout
    assert not list(tmp_path.glob(".submitit/*/*_submitted.pkl"))  # nothing was submitted
