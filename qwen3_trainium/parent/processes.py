"""torchrun as a process: started tied to the launcher (``shared/lifeline.py``), its output
to ``torchrun.log`` (and a live progress line, or rank 0's log), waited for while stop signals
are passed on (``signals.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

from qwen3_trainium.config.schema import Progress
from qwen3_trainium.parent import signals
from qwen3_trainium.shared import lifeline, stopfiles

TORCHRUN_LOG = "torchrun.log"


TAIL_LINES = 40


def use_progress(mode: Progress, tty: bool) -> bool:
    return mode is Progress.on or (mode is Progress.auto and tty)


def tail(path: str, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Started:
    """A torchrun the launcher started; ``log`` is rank 0's output file in progress mode."""

    process: subprocess.Popen
    log_path: str | None = None
    log: object = None


def start(argv: list[str], env: dict[str, str], *, run_dir: str, progress: bool) -> Started:
    """Start torchrun. Without ``progress`` rank 0's output streams to the terminal; with it,
    torchrun's output goes to ``<run_dir>/torchrun.log`` (see ``finish``)."""
    full_env = {**os.environ, **env}
    if not progress:
        return Started(popen(argv, full_env))
    log_path = os.path.join(run_dir, TORCHRUN_LOG)
    print(f"[qwen3-trainium] rank 0's output: {log_path} (every rank: {run_dir}/logs)", flush=True)
    log = open(log_path, "w")
    return Started(popen(argv, full_env, stdout=log, stderr=subprocess.STDOUT), log_path, log)


def popen(argv: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
    """torchrun dies with the launcher, and its ranks with it (``lifeline.py``). While stop signals
    are handled (``signals.LauncherSignals``, see ``run_job``), torchrun runs in a session of its own
    with SIGTERM ignored, and the launcher passes signals on (``signals.py``)."""
    env = {**env, lifeline.PARENT_ENV: str(os.getpid())}
    tie = lifeline.preexec(os.getpid())
    active = signals.LauncherSignals.current
    if active is None:
        return subprocess.Popen(argv, env=env, preexec_fn=tie, **kwargs)
    env = {**env, **signals.torchrun_env(env)}

    def setup() -> None:  # after the fork: prctl, getppid and sigaction only (``lifeline.py``)
        tie()
        signals.ignore_sigterm()

    with active.starting(env.get(stopfiles.REQUEST_ENV)):
        process = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=setup, **kwargs)
        active.attach(process)
    return process


def wait_for(process: subprocess.Popen) -> int:
    active = signals.LauncherSignals.current
    while True:
        try:
            code = process.wait(timeout=None if active is None else signals.POLL_S)
        except subprocess.TimeoutExpired:
            active.tick()  # after a fast stop: torchrun once its ranks left, or all at the grace's end
            continue
        if active is not None:
            active.reap()  # after a fast stop: any rank still unwinding
        return code


def finish(started: Started, *, run_dir: str, total_steps: int) -> int:
    """Wait for torchrun; return its exit status. In progress mode one live line shows steps,
    loss, tokens/s and ETA meanwhile, and the log's tail is printed if the run fails."""
    if started.log is None:
        return wait_for(started.process)
    from qwen3_trainium.parent.progress import ProgressLine

    with started.log, ProgressLine(run_dir, total_steps, sys.stdout):
        code = wait_for(started.process)
    if code != 0:
        print(f"[qwen3-trainium] torchrun exited {code}; the end of {started.log_path}:", file=sys.stderr)
        print(tail(started.log_path), file=sys.stderr, end="", flush=True)
    return code
