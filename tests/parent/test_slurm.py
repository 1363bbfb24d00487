"""``hydra/launcher=submitit_slurm``: without Slurm (the dry run, a submission that cannot be
made, what a job does when Slurm ends an attempt) and, marked slow, against a real Slurm: two
slurmd nodes on this machine (``tests/slurm/start_cluster.sh``), one Slurm job per sweep job,
one torchrun per node, a job requeued twice."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, read_metrics, run_launch
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf

from hydra_plugins.qwen3_trainium_slurm import requeue
from hydra_plugins.qwen3_trainium_slurm.launcher import Qwen3SlurmLauncher

SLURM_DIR = Path("/tmp/q3t-slurm-tests")
SLURM_COMMANDS = (
    *("sbatch", "srun", "squeue", "sacct", "scancel", "scontrol", "sinfo", "salloc"),
    *("sattach", "sbcast", "sstat", "sprio", "sshare", "sdiag", "sreport", "sacctmgr", "strigger"),
)
# the README's dry run (Hydra's -m goes after every override)
README_DRY_RUN = (
    "hydra/launcher=submitit_slurm", "cluster=slurm_trn2", "launcher.nnodes=4", "model=native",
    "model.flavor=8B", "dry_run=true",
)  # fmt: skip


@pytest.fixture
def path_without_slurm(tmp_path) -> str:
    """This machine's PATH less Slurm's commands: one directory of links to every other program."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for entry in os.environ["PATH"].split(os.pathsep):
        for program in Path(entry).glob("*") if os.path.isdir(entry) else ():
            link = bin_dir / program.name
            if program.name in SLURM_COMMANDS or os.path.lexists(link) or not os.access(program, os.X_OK):
                continue
            link.symlink_to(program)
    assert not [c for c in SLURM_COMMANDS if shutil.which(c, path=str(bin_dir))]
    return str(bin_dir)


def test_dry_run_renders_every_job_and_node_on_a_machine_without_slurm(tmp_path, path_without_slurm):
    sweep_dir = tmp_path / "sweep"
    proc = run_launch(*README_DRY_RUN, f"hydra.sweep.dir={sweep_dir}", "-m", env={"PATH": path_without_slurm})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --requeue"):
        assert line in proc.stdout
    assert "#SBATCH --signal=URG@120" in proc.stdout and "export SUBMITIT_PREEMPT_SIGNAL=URG" in proc.stdout
    assert "# torchrun command (on each of the 4 nodes" in proc.stdout
    assert (
        "--nnodes=4 --nproc_per_node=64 --rdzv_backend c10d --rdzv_endpoint '<head node>:29500'"
        in proc.stdout
    )
    assert "FI_PROVIDER=efa" in proc.stdout and "checkpoint:\n  enable: true" in proc.stdout  # resume
    assert not (sweep_dir / ".submitit").exists()  # nothing was submitted


def test_submitting_without_slurm_stops_with_one_line_naming_the_fix(tmp_path, path_without_slurm):
    sweep_dir = tmp_path / "sweep"
    proc = run_launch(
        "-m",
        "cluster=slurm_local",
        "smoke=on",
        f"hydra.sweep.dir={sweep_dir}",
        env={"PATH": path_without_slurm},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "qwen3-trainium: sbatch and srun not found on PATH: submit from a Slurm login node,"
        " or add dry_run=true to render the scripts here (nothing was submitted)"
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (sweep_dir / ".submitit").exists()


def test_a_submission_that_sbatch_refuses_stops_with_one_line_naming_the_fix(tmp_path, path_without_slurm):
    """sbatch on PATH but no controller to reach (a laptop with Slurm's client, a wrong
    partition): one line with sbatch's message and the fix, exit 2, no traceback."""
    refusal = "sbatch: fatal: Could not establish a configuration source"
    for name, body in (("sbatch", f"echo '{refusal}' >&2; exit 1"), ("srun", "exit 0")):
        program = Path(path_without_slurm) / name
        program.write_text(f"#!/bin/sh\n{body}\n")
        program.chmod(0o755)
    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    proc = run_launch("-m", "cluster=slurm_local", "smoke=on", sweep, env={"PATH": path_without_slurm})
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"qwen3-trainium: sbatch refused the submission ({refusal}): check hydra.launcher.partition"
    )
    assert last.endswith("(nothing was submitted)") and "Traceback" not in proc.stdout + proc.stderr


def _submitit_requeues(signum, frame):
    raise SystemExit(-1)  # what submitit's handler does after `scontrol requeue` (SignalHandler._exit)


@pytest.fixture
def job_side(tmp_path, monkeypatch):
    """``Qwen3SlurmLauncher.__call__`` as a Slurm task runs it, around a stand-in for the Hydra
    job that ran ``steps`` of 8 and got ``signum`` meanwhile; SIGTERM and SIGURG restored after."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGURG)}
    monkeypatch.setattr("submitit.JobEnvironment.USR_SIG", requeue.WARNING_SIGNAL)
    signal.signal(signal.SIGURG, _submitit_requeues)
    signal.signal(signal.SIGTERM, lambda *_: None)  # should the code under test not take it over
    (tmp_path / "job.json").write_text(json.dumps({"total_steps": 8}))

    def call(steps: int, signum: int | None) -> JobReturn:
        def hydra_job(self, *args):
            with open(tmp_path / "metrics.jsonl", "w") as f:
                f.writelines(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, steps + 1))
            if signum is not None:
                os.kill(os.getpid(), signum)
            ret = JobReturn(status=JobStatus.COMPLETED, _return_value=None)
            ret.hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(tmp_path)}}})
            return ret

        monkeypatch.setattr(SlurmLauncher, "__call__", hydra_job)
        return Qwen3SlurmLauncher.__call__(object.__new__(Qwen3SlurmLauncher))

    yield call
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGURG], ids=["SIGTERM", "SIGURG"])
def test_an_attempt_slurm_ends_before_the_last_step_reports_no_result(job_side, signum):
    with pytest.raises(SystemExit, match="before the last step: no result"):
        job_side(steps=5, signum=signum)


def test_an_attempt_that_trained_to_the_end_reports_its_result(job_side):
    assert job_side(steps=8, signum=None).status is JobStatus.COMPLETED
    assert job_side(steps=8, signum=signal.SIGTERM).status is JobStatus.COMPLETED  # ended after its last step


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


@pytest.mark.slow
@pytest.mark.heavy
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


def _wait_for(what: str, probe, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while not (found := probe()):
        assert time.monotonic() < deadline, f"gave up waiting for {what} after {timeout:.0f} s"
        time.sleep(0.2)
    return found


def _submitted_job(sweep_dir: Path) -> str | None:
    """The Slurm job id, once submitit has made the job's folder (``.submitit/<job id>``)."""
    return next((p.name for p in sweep_dir.glob(".submitit/*") if p.is_dir() and p.name.isdigit()), None)


def _slurm(env: dict, *argv: str) -> str:
    return subprocess.run(argv, env={**os.environ, **env}, check=True, capture_output=True, text=True).stdout


def _requeued_then_released(env: dict, job_id: str) -> None:
    """Slurm holds a requeued batch job (on this cluster: BeginTime = requeue time + 120 s); a test
    need not wait for that, so the job is made eligible at once."""
    _wait_for("the requeued job", lambda: _slurm(env, "squeue", "-h", "-j", job_id, "-o", "%T %r").strip() == "PENDING BeginTime", 60)  # fmt: skip
    _slurm(env, "scontrol", "update", f"JobId={job_id}", "StartTime=now")


def _saved_steps(run_dir: Path) -> list[int]:
    return sorted(
        int(p.parent.name.removeprefix("step-")) for p in run_dir.glob("checkpoint/step-*/.metadata")
    )


def _loaded_steps(run_dir: Path) -> list[int]:
    """The step each torchrun of the run resumed from (torchtitan's own log line, rank 0's stdout)."""
    logs = sorted(run_dir.glob("logs/*/attempt_0/0/stdout.log"), key=lambda p: p.stat().st_mtime)
    return [
        int(s) for p in logs for s in re.findall(r"Loading the checkpoint from \S+/step-(\d+)", p.read_text())
    ]


@pytest.mark.slow
@pytest.mark.heavy
def test_a_job_requeued_by_slurm_and_at_the_time_limit_resumes_and_the_sweep_ends_ok(tmp_path, slurm_env):
    """Attempt 1 is requeued by Slurm (``scontrol requeue``, as on preemption), attempt 2 by
    submitit on the time-limit warning (SIGURG, which Slurm sends ``signal_delay_s`` before the
    limit), attempt 3 trains to the end. Each resumes from a checkpoint in the same run directory."""
    sweep_dir, steps = tmp_path / "sweep", 30
    run_dir, done = sweep_dir / "0", []
    parent = threading.Thread(target=lambda: done.append(run_launch(
        "-m", "cluster=slurm_local", "launcher.nnodes=1", "launcher.nproc_per_node=1", "model=native", "smoke=on",
        f"training.steps={steps}", "checkpoint=resume", "checkpoint.interval=5", "tracking=off",
        f"hydra.sweep.dir={sweep_dir}", env=slurm_env, timeout=900,
    )))  # fmt: skip
    parent.start()
    job_id = None
    try:
        job_id = _wait_for("the submission", lambda: _submitted_job(sweep_dir))
        _wait_for("attempt 1's first checkpoint", lambda: _saved_steps(run_dir))
        _slurm(slurm_env, "scontrol", "requeue", job_id)
        _requeued_then_released(slurm_env, job_id)
        first = _wait_for("attempt 2's resume", lambda: _loaded_steps(run_dir))[0]
        _wait_for("attempt 2's checkpoint", lambda: max(_saved_steps(run_dir), default=0) > first)
        _slurm(slurm_env, "scancel", "--signal=URG", job_id)  # what --signal=URG@120 sends
        _requeued_then_released(slurm_env, job_id)
        parent.join(timeout=900)
    finally:
        if parent.is_alive() and job_id:
            subprocess.run(["scancel", job_id], env={**os.environ, **slurm_env}, check=False)
        parent.join(timeout=120)
    proc = done[0]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(sweep_dir / "summary.csv") as f:
        (row,) = csv.DictReader(f)
    assert (row["status"], row["steps"]) == ("ok", f"{steps}/{steps}")
    loaded = _loaded_steps(run_dir)
    assert len(loaded) == 2 and 0 < loaded[0] < loaded[1] < steps, loaded  # resumed twice, never from 0
    logged = [row["step"] for row in read_metrics(run_dir)]
    assert logged.count(1) == 1 and logged[-1] == steps  # no attempt started over; the last step reached
    assert len(list(run_dir.glob("logs/*/attempt_0/0/stdout.log"))) == 3  # three torchruns
    task_log = "".join(p.read_text() for p in (sweep_dir / ".submitit" / job_id).glob("*_log.*"))
    assert f"Requeued job {job_id}" in task_log  # submitit's checkpoint-and-requeue, on SIGURG


@pytest.mark.slow
@pytest.mark.heavy
def test_a_job_cancelled_for_good_is_a_failed_job_of_the_sweep_not_a_traceback(tmp_path, slurm_env):
    sweep_dir, done = tmp_path / "sweep", []
    parent = threading.Thread(target=lambda: done.append(run_launch(
        "-m", "cluster=slurm_local", "launcher.nnodes=1", "launcher.nproc_per_node=1", "smoke=on", "tracking=off",
        f"hydra.sweep.dir={sweep_dir}", env=slurm_env, timeout=300,
    )))  # fmt: skip
    parent.start()
    job_id = _wait_for("the submission", lambda: _submitted_job(sweep_dir))
    _slurm(slurm_env, "scancel", job_id)
    parent.join(timeout=300)
    proc = done[0]
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert f"Slurm job {job_id} ended CANCELLED" in proc.stderr
    with open(sweep_dir / "summary.csv") as f:
        (row,) = csv.DictReader(f)
    assert row["status"] == "failed"
    record = json.loads((sweep_dir / "0" / "job.json").read_text())
    assert record["slurm_state"].startswith("CANCELLED") and record["slurm_job_id"] == job_id
