"""Stop signals (``qwen3_trainium/rank/stop.py``, ``trainer.py``): SIGTERM saves at the next step
boundary and exits 143, SIGINT stops every rank at once and exits 130, job.json says
``interrupted``, and the same command resumes to the loss an uninterrupted run ends at."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, SESSION_PREFLIGHT_CACHE, run_launch, start_launch

from qwen3_trainium.parent import report, signals
from qwen3_trainium.shared import stopfiles

# Two ranks (so they must agree on the step), the tiny CPU model, short rows: start-up dominates.
RUN = [
    "parallel=cpu2",
    "training.steps=30",
    "training.local_batch_size=1",
    "training.seq_len=64",
    "tracking=off",
    "checkpoint=resume",
]


def _job(run_dir: Path) -> dict:
    return json.loads((run_dir / "job.json").read_text())


def _processes_of(run_dir: Path) -> list[str]:
    """Every process (but this one) whose command line or environment names ``run_dir``: the
    launcher, torchrun, and the ranks (their environment holds QWEN3_TRAINIUM_RUN_DIR)."""
    needle, found = str(run_dir).encode(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue  # gone, or not ours
        if needle in cmdline or needle in environ:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry}: {command[:160]}")
    return found


def _descendants(pid: int) -> list[int]:
    children = signals.child_pids(pid)
    return children + [d for child in children for d in _descendants(child)]


@pytest.fixture
def launch(tmp_path):
    """Start ``python launch.py ARGS`` in the background (output in ``<name>.log`` beside the run
    directory); on teardown, SIGKILL whatever of those runs is still alive."""
    run_dirs: list[Path] = []
    logs: list = []

    def start(run_dir: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
        run_dirs.append(run_dir)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "offline",
            "XDG_CACHE_HOME": str(SESSION_PREFLIGHT_CACHE),
            **(env or {}),
        }
        log = open(tmp_path / f"{run_dir.name}.{len(run_dirs)}.log", "w")  # noqa: SIM115 (closed on teardown)
        logs.append(log)
        return start_launch(*args, f"hydra.run.dir={run_dir}", env=env, stdout=log, stderr=subprocess.STDOUT)

    yield start
    for run_dir in run_dirs:
        for line in _processes_of(run_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
    for log in logs:
        log.close()


def _wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not any(row["step"] >= step for row in report.read_metrics(str(run_dir))):
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before step {step}"
        assert time.monotonic() < deadline, f"no step {step} within {timeout} s"
        time.sleep(0.05)


def _log(tmp_path: Path, run_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted(tmp_path.glob(f"{run_dir.name}.*.log")))


def _checkpoint_saved(run_dir: Path, step: int) -> bool:
    return (run_dir / "checkpoint" / f"step-{step}" / ".metadata").is_file()


@pytest.mark.slow
@pytest.mark.heavy
def test_sigterm_saves_at_the_next_step_and_the_same_command_resumes_to_the_same_loss(tmp_path, launch):
    """SIGTERM to the launcher, which passes it on to every rank. torchrun gets one too, as under
    Slurm (which signals every process of the job step): with its grace period at 0 s, handling
    it would SIGKILL the ranks before they save, so this also shows that torchrun leaves the stop
    to the ranks. (A rank signalled directly: ``test_ranks_agree_on_the_step...``.)"""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    proc = run_launch(*RUN, "checkpoint.interval=10", f"hydra.run.dir={straight}")
    assert proc.returncode == 0, proc.stderr[-3000:]

    first = launch(stopped, *RUN, "checkpoint.interval=10", env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "0"})
    _wait_for_step(first, stopped, 13)
    (torchrun,) = signals.child_pids(first.pid)
    first.send_signal(signal.SIGTERM)
    os.kill(torchrun, signal.SIGTERM)
    assert first.wait(timeout=120) == 143, _log(tmp_path, stopped)[-3000:]
    job = _job(stopped)
    assert (job["status"], job["exit_code"]) == ("interrupted", 143)
    at = job["stop"]["step"]
    assert job["stop"]["signal_name"] == "SIGTERM" and job["stop"]["checkpoint_step"] == at
    assert 13 <= at < 30 and _checkpoint_saved(stopped, at), "saved off the interval, past step 10"
    assert max(row["step"] for row in report.read_metrics(str(stopped))) == at

    again = run_launch(*RUN, "checkpoint.interval=10", f"hydra.run.dir={stopped}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {stopped}/checkpoint/step-{at}" in again.stdout
    job = _job(stopped)
    assert (job["status"], job["exit_code"], job["stop"]) == ("ok", 0, None)
    assert report.read_metrics(str(stopped))[-1]["step"] == 30
    assert report.read_metrics(str(straight))[-1]["step"] == 30
    diff = abs(report.final_loss(str(stopped)) - report.final_loss(str(straight)))
    print(f"SIGTERM at step {at}, resumed: final loss differs from an uninterrupted run's by {diff:.2e}")
    assert diff <= 1e-5


@pytest.mark.slow
def test_sigint_stops_every_rank_within_seconds_and_leaves_no_process(tmp_path, launch):
    run_dir = tmp_path / "ctrl_c"
    proc = launch(run_dir, *RUN)
    _wait_for_step(proc, run_dir, 2)
    assert len(_descendants(proc.pid)) >= 3, "torchrun and two ranks"
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    code = proc.wait(timeout=60)
    took = time.monotonic() - sent
    print(f"SIGINT: the launcher exited {code} after {took:.1f} s")
    text = _log(tmp_path, run_dir)
    assert code == 130 and took <= 15, text[-3000:]
    assert _processes_of(run_dir) == []
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]  # a stop asked for
    assert "stopped by SIGINT at once, nothing saved at the stop (exit 130)" in text, text[-500:]
    job = _job(run_dir)
    assert (job["status"], job["exit_code"], job["stop"]) == ("interrupted", 130, None)


# The ranks' agreement, without torchtitan: two gloo processes run StopAtSignal over a stand-in
# for torchtitan's training loop; only rank 1 is signalled, and rank 0 lags behind it.
AGREE = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import torch.distributed as dist
    from qwen3_trainium.rank import stop
    from qwen3_trainium.rank.trainer import StopAtSignal

    rank, store, run_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.environ["QWEN3_TRAINIUM_RUN_DIR"] = run_dir
    stop.install_rank_handler({})
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)

    class Checkpointer:
        saved = []
        def save_at_stop(self, step):
            self.saved.append(step)
            return True

    class Loop:  # what StopAtSignal uses of torchtitan's Trainer
        step, checkpointer = 0, Checkpointer()
        def should_continue_training(self):
            return self.step < 20

    class Trainer(StopAtSignal, Loop):
        pass

    trainer = Trainer()
    while trainer.should_continue_training():
        trainer.step += 1
        if rank == 1 and trainer.step == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        if rank == 0:
            time.sleep(0.05)
    print(json.dumps({"stopped_at": trainer.stopped_at, "saved": Checkpointer.saved, "own": stop.requested()}))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as a rank leaves (train.py): torch's C++ teardown can abort a finished process
    """
)


def test_ranks_agree_on_the_step_when_one_rank_is_signalled(tmp_path):
    script = tmp_path / "agree.py"
    script.write_text(AGREE)
    argv = [sys.executable, str(script)]
    procs = [
        subprocess.Popen(
            [*argv, str(r), str(tmp_path / "store"), str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE
        )
        for r in (0, 1)
    ]
    results = [json.loads(p.communicate(timeout=120)[0].decode().splitlines()[-1]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [r["own"] for r in results] == [0, signal.SIGTERM]  # rank 0 only learnt it from rank 1
    assert [(r["stopped_at"], r["saved"]) for r in results] == [(5, [5]), (5, [5])]
    marker = json.loads((tmp_path / stopfiles.MARKER_NAME).read_text())
    assert marker == {"signal": 15, "signal_name": "SIGTERM", "step": 5, "checkpoint_step": 5}


def test_without_checkpointing_a_stop_saves_nothing():
    from qwen3_trainium.rank.checkpoint import Qwen3CheckpointManager

    config = Qwen3CheckpointManager.Config(enable=False)
    manager = config.build(
        dataloader=None, model_parts=[], optimizers=None, lr_schedulers=None, states={}, sd_adapter=None
    )
    assert manager.save_at_stop(5) is False


def test_a_rank_still_starting_takes_the_launchers_request(tmp_path):
    """torchrun's workers start ignoring SIGTERM; the request file, written before the launcher
    signals anyone, covers a rank that was not yet listening. Afterwards SIGTERM only sets the flag."""
    request = tmp_path / "stop_request.json"
    code = (
        "import os, signal\nfrom qwen3_trainium.rank import stop\nfrom qwen3_trainium.shared import stopfiles\n"
        f"stop.install_rank_handler({{stopfiles.REQUEST_ENV: {str(request)!r}}})\nprint(stop.requested())\n"
        "os.kill(os.getpid(), signal.SIGTERM)\nprint(stop.requested())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "15"]  # no request: the signal itself sets it, the rank lives
    stopfiles.write_json(str(request), {"signal": int(signal.SIGTERM)})
    code = code.replace("os.kill(os.getpid(), signal.SIGTERM)\n", "")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["15", "15"]


def test_a_signal_before_torchrun_started_ends_the_job_and_reaches_an_outer_handler():
    """Nothing to pass on yet: the launcher's job ends (exit 143); a handler installed around the
    job (as Slurm requeue's is) still hears the signal and is back in place afterwards."""
    code = textwrap.dedent(
        """
        import os, signal, time
        from qwen3_trainium.parent import signals
        from qwen3_trainium.shared import stopfiles
        heard = []
        def outer(signum, frame):
            heard.append(signum)
        signal.signal(signal.SIGTERM, outer)
        try:
            with signals.LauncherSignals():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            print("not interrupted")
        except signals.Interrupted as stopped:
            print(stopfiles.exit_code(stopped.signum), heard, signal.getsignal(signal.SIGTERM) is outer)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "143 [15] True"


class _Signals:
    def __init__(self, first):
        self.first = first


@pytest.mark.parametrize(
    ("code", "marker", "first", "expected"),
    [
        (0, None, None, ("ok", 0)),
        (1, None, None, ("failed", 1)),
        (0, {"signal": 15}, 15, ("interrupted", 143)),  # stopped at a step boundary
        (0, {"signal": 15}, None, ("interrupted", 143)),  # a rank alone was signalled
        (1, None, 2, ("interrupted", 130)),  # Ctrl-C: torchrun ended the ranks
        (0, None, 15, ("ok", 0)),  # the last step came before the stop took effect
    ],
)
def test_outcome(code, marker, first, expected):
    assert signals.outcome(code, marker, _Signals(first)) == expected


def test_torchrun_handles_every_signal_it_did_but_sigterm():
    assert signals.torchrun_env({}) == {"PET_SIGNALS_TO_HANDLE": "SIGINT,SIGHUP,SIGQUIT"}
    assert signals.torchrun_env({"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGUSR1"}) == {
        "PET_SIGNALS_TO_HANDLE": "SIGUSR1"
    }


@pytest.mark.slow
@pytest.mark.heavy
def test_sigkill_of_the_launcher_leaves_no_torchrun_and_no_rank(tmp_path, launch):
    """SIGKILL cannot be handled: the kernel's parent-death signals (``lifeline.py``) end
    torchrun with the launcher and each rank with torchrun."""
    run_dir = tmp_path / "killed"
    proc = launch(run_dir, *RUN)
    _wait_for_step(proc, run_dir, 2)
    tree = _descendants(proc.pid)
    assert len(tree) >= 3, "torchrun and two ranks"
    proc.kill()
    proc.wait(timeout=10)
    sent, left = time.monotonic(), _processes_of(run_dir)
    while left and time.monotonic() - sent < 5:
        time.sleep(0.05)
        left = _processes_of(run_dir)
    print(
        f"SIGKILL of the launcher: {len(tree)} processes under it, {len(left)} left after {time.monotonic() - sent:.2f} s"
    )
    assert left == [], left


def test_a_child_tied_by_lifeline_dies_with_its_parent(tmp_path):
    """Without torchrun: a parent starts a child with ``lifeline.preexec`` and is SIGKILLed; the
    child (which would sleep a minute) is gone at once. A child set up after its parent died
    leaves by itself (``die_with_parent`` sees a foreign grandparent)."""
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from qwen3_trainium.shared import lifeline
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 preexec_fn=lifeline.preexec(os.getpid()))
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert signals._alive(child)
    parent.kill()
    parent.wait(timeout=10)
    deadline = time.monotonic() + 5
    while signals._alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not signals._alive(child)
    orphan = subprocess.run(
        [sys.executable, "-c", "from qwen3_trainium.shared import lifeline; lifeline.die_with_parent(); print('ran on')"],
        cwd=ROOT, env={**os.environ, "QWEN3_TRAINIUM_LAUNCHER_PID": "1"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert orphan.returncode == 1 and "ran on" not in orphan.stdout, orphan
    assert "torchrun ended before this rank started" in orphan.stderr
