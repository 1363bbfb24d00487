"""Launcher overhead without losing the guarantee: the checks that need no torch run before any
process starts, the rest while the ranks import torch (they wait for the verdict), and a pass is
remembered. A refused run still exits 2 with every problem named, no step, no checkpoint."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys

import pytest
from conftest import ROOT, run_launch

from qwen3_trainium.parent import report
from qwen3_trainium.shared import gate

STATIC_CONFIGS = [
    ["model=native", "smoke=on"],
    ["model=hf"],
    ["model=nki_moe"],
    ["model=native", "device=neuron", "parallel=trn2_tp4_fsdp16", "model.flavor=8B", "compile=on"],
    ["model=native", "training.steps=0", "compile=on"],
]


def test_the_static_checks_and_the_launch_plan_import_no_torch():
    script = f"""
import os, sys
from hydra import compose as hydra_compose, initialize_config_dir
from qwen3_trainium.parent import compose, launcher, preflight
compose.register(); compose.register_resolvers()
for overrides in {STATIC_CONFIGS!r}:
    with initialize_config_dir(config_dir={str(ROOT / "conf")!r}, version_base="1.3"):
        run = compose.resolve(hydra_compose("config", overrides=overrides), {str(ROOT)!r})
    preflight.check_static(run, "/tmp/r", launching=True)
    preflight.installed_versions(run)
    launcher.torchrun_argv(run, "/tmp/r"), launcher.rank_env(run, "/tmp/r", dict(os.environ))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchtitan", "transformers", "matplotlib")))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_ranks_never_import_hydra_or_omegaconf():
    script = "import sys, qwen3_trainium.rank.titan, qwen3_trainium.rank.train, qwen3_trainium.shared.gate; print([m for m in sys.modules if m.startswith(('hydra', 'omegaconf'))])"
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


RANK = "from qwen3_trainium.shared import gate; gate.hold_rank(); print('went on', flush=True)"
# The same rank, saying "waiting" once it has looked for the verdict and found none.
WAITING_RANK = """
from qwen3_trainium.shared import gate
read = gate.read
def looked(path):
    verdict = read(path)
    if verdict is None and gate.read is looked:
        print("waiting", flush=True)
        gate.read = read
    return verdict
gate.read = looked
gate.hold_rank()
print("went on", flush=True)
"""
RANK_TIMEOUT_S = 60  # a rank that still waits then would have waited forever: a failure, not a hang
PIPES = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}


def _rank_env(verdict=None, launcher_pid=None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (gate.VERDICT_ENV, gate.LAUNCHER_PID_ENV)}
    if verdict is not None:
        env[gate.VERDICT_ENV] = str(verdict)
    if launcher_pid is not None:
        env[gate.LAUNCHER_PID_ENV] = str(launcher_pid)
    return env


def _start_rank(env: dict[str, str], script: str = RANK) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT, **PIPES)


def _bounded(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    """The rank's end (exit code, stdout, stderr); a rank still running after RANK_TIMEOUT_S is
    killed and the test fails."""
    try:
        out, err = proc.communicate(timeout=RANK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the rank was still waiting after {RANK_TIMEOUT_S} s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _hold_rank(env: dict[str, str]) -> subprocess.CompletedProcess:
    return _bounded(_start_rank(env))


def _until_waiting(rank: subprocess.Popen) -> None:
    """Until the rank has looked for its verdict and found none (bounded, as ``_bounded``)."""
    ready, _, _ = select.select([rank.stdout], [], [], RANK_TIMEOUT_S)
    line = rank.stdout.readline() if ready else ""
    if line != "waiting\n":
        rank.kill()
        pytest.fail(f"the rank did not wait for its verdict: {line!r} {rank.communicate()}")


def test_a_rank_goes_on_at_ok_and_exits_at_a_refusal(tmp_path):
    verdict = tmp_path / "verdict.json"
    gate.write(str(verdict), ok=True)
    went = _hold_rank(_rank_env(verdict, os.getpid()))  # the launcher (here: pytest) is alive
    assert (went.returncode, went.stdout, went.stderr) == (0, "went on\n", "")
    gate.write(str(verdict), ok=False, problems=2)
    refused = _hold_rank(_rank_env(verdict, os.getpid()))
    # quietly and with 0: the launcher prints the problems and exits 2
    assert (refused.returncode, refused.stdout, refused.stderr) == (0, "", "")


def test_a_rank_stops_when_the_launcher_died_without_a_verdict(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stopped = _hold_rank(_rank_env(tmp_path / "never.json", dead.pid))
    assert stopped.returncode == 1 and stopped.stdout == ""
    assert "exited before its pre-flight verdict" in stopped.stderr


def test_a_waiting_rank_stops_when_its_launcher_dies(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        rank = _start_rank(_rank_env(tmp_path / "verdict.json", launcher.pid), WAITING_RANK)
        _until_waiting(rank)
    finally:
        launcher.kill()
        launcher.wait()
    orphaned = _bounded(rank)
    assert orphaned.returncode == 1 and orphaned.stdout == "", orphaned.stderr


def test_a_waiting_rank_goes_on_at_a_verdict_written_later(tmp_path):
    verdict = tmp_path / "verdict.json"
    rank = _start_rank(_rank_env(verdict, os.getpid()), WAITING_RANK)
    _until_waiting(rank)
    gate.write(str(verdict), ok=True)
    went = _bounded(rank)
    assert (went.returncode, went.stdout) == (0, "went on\n"), went.stderr


@pytest.mark.parametrize("verdict", [None, ""], ids=["unset", "empty"])
def test_a_rank_started_by_hand_does_not_wait(verdict):
    """No verdict file named (a dry run's printed command run by hand): the rank goes on at once,
    even with a live launcher pid in its environment (``RANK_TIMEOUT_S`` bounds a wait)."""
    started = _hold_rank(_rank_env(verdict, os.getpid()))
    assert (started.returncode, started.stdout) == (0, "went on\n"), started.stderr


def test_a_pass_is_remembered_and_anything_the_checks_read_invalidates_it(dry_run, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text('{"text": "hello"}\n')
    args = ("model=native", "data=local", f"data.dataset_path={data}")
    (_, code), first, _ = dry_run(ROOT, tmp_path / "r1", *args)
    assert code == 0 and "(cached" not in first
    (_, code), second, _ = dry_run(ROOT, tmp_path / "r2", *args)
    assert code == 0 and "pre-flight: passed before" in second
    assert first.split("# resolved config")[0] in second  # the same notes, from the cache
    (data / "b.jsonl").write_text('{"text": "more"}\n')  # an input changed: checked again
    (_, code), third, _ = dry_run(ROOT, tmp_path / "r3", *args)
    assert code == 0 and "(cached" not in third
    (_, code), off, _ = dry_run(ROOT, tmp_path / "r4", *args, "preflight_cache=false")
    assert code == 0 and "(cached" not in off


def test_a_refusal_is_never_remembered(dry_run, tmp_path):
    args = (
        "model=native",
        "launcher.nproc_per_node=2",
        "parallel.tensor_parallel_degree=2",
        "model.flavor=0.6B",
    )
    for attempt in range(2):
        (_, code), out, err = dry_run(ROOT, tmp_path / f"r{attempt}", *args, "training.seq_len=257")
        assert code == 2 and "training.seq_len" in err


@pytest.mark.slow
def test_a_torchtitan_level_refusal_after_the_ranks_started_exits_2_and_leaves_nothing(tmp_path):
    """TP 3 divides neither the 4 heads nor the 2 KV heads of tiny: only the model built by
    torchtitan shows it. The static checks pass, torchrun starts, the ranks wait; the verdict
    refuses, the problem is named, nothing trained, no checkpoint, and a resume's files are kept."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "resolved.yaml").write_text("# the resolved.yaml of an earlier run\n")
    proc = run_launch(
        *("model=native", "smoke=on", "tracking=off", "checkpoint=resume", "checkpoint.interval=1"),
        *("launcher.nproc_per_node=3", "launcher.oversubscribe=true", "parallel.tensor_parallel_degree=3"),
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "torchrun --nnodes=1 --nproc_per_node=3" in proc.stdout  # the ranks had started
    assert "the ranks stopped before touching a device" in proc.stderr
    assert "- parallel.tensor_parallel_degree = 3: does not divide the 4 attention heads" in proc.stderr
    assert "Training starts" not in proc.stdout + proc.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoint").exists()
    assert (run_dir / "resolved.yaml").read_text() == "# the resolved.yaml of an earlier run\n"
    assert not (run_dir / "resolved.staged.yaml").exists() and not (run_dir / "verdict.json").exists()
    job = json.loads((run_dir / "job.json").read_text())
    assert (job["status"], job["exit_code"]) == ("failed", 2)
    assert report.read_metrics(str(run_dir)) == []


def test_a_remembered_pass_does_not_outlive_the_compiler_it_found(dry_run, tmp_path, monkeypatch):
    args = ("model=native", "compile=on")
    (_, code), _, _ = dry_run(ROOT, tmp_path / "r1", *args)
    assert code == 0
    monkeypatch.setenv("CXX", "no-such-compiler")  # what check_compile reads: a new key
    (_, code), _, err = dry_run(ROOT, tmp_path / "r2", *args)
    assert code == 2 and "no compiler was found" in err
