"""Stop signals: SIGTERM stops every rank at the next step boundary with a checkpoint; SIGINT,
SIGHUP and SIGQUIT stop them at once. Exit code 128 + the signal (143, 130, 129, 131).

Launcher side (``LauncherSignals``, installed while ``launcher.run_job`` runs a job):
- before torchrun starts, a signal ends the job (``Interrupted``): nothing is left to stop;
- torchrun runs in a session of its own, ignoring SIGTERM, so that the launcher is the one
  that passes a signal on (a terminal's Ctrl-C reaches the launcher alone) and torchrun's
  grace period cannot cut a save short. torch's elastic agent would otherwise answer SIGTERM
  by signalling every worker's process group and SIGKILLing it after ``--shutdown-timeout``
  (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, 30 s): ``torch/distributed/elastic/agent/server/api.py``
  ``run`` -> ``_shutdown``, ``torch/distributed/elastic/multiprocessing/api.py``
  ``SubprocessContext._close``. ``PET_SIGNALS_TO_HANDLE`` (torchrun's ``--signals-to-handle``,
  ``torch/distributed/run.py``) keeps its handlers for the other signals;
- SIGTERM: ``stop_request*.json`` is written, then every rank (torchrun's children) gets
  SIGTERM; torchrun is not signalled and exits 0 once the ranks have saved and exited;
- SIGINT, SIGHUP, SIGQUIT: torchrun is frozen (SIGSTOP, so that it starts no worker meanwhile),
  its workers are listed, each rank's process group (each rank leads one: torch's
  ``SubprocessHandler._popen``, ``start_new_session=True``) gets SIGINT, which a rank turns into
  a quiet exit, and torchrun is SIGKILLed once they have left (before, their parent-death
  signal, ``lifeline.py``, would SIGKILL them mid-exit). Passing the signal to torchrun instead would print its
  ``SignalException`` traceback, and the ranks' ``KeyboardInterrupt`` ones, on the user's
  terminal for a stop the user asked for. The launcher waits for the ranks; whatever is still
  alive ``KILL_AFTER_S`` later, or at a second signal, is SIGKILLed.
Rank side (``rank/stop.py``: ``install_rank_handler``, first thing in ``qwen3_trainium.rank.train``): SIGTERM only sets
a flag that the trainer reads at each step boundary (``qwen3_trainium/rank/trainer.py``). A rank
that was still starting when SIGTERM came ignored it (torchrun's workers inherit its SIG_IGN),
so the handler also reads the launcher's request file, written before any rank is signalled.
Under Slurm every process of the step gets SIGTERM at once: the ranks' own copies and the
launcher's end the same way. Rank 0 records where the ranks stopped in ``stopped.json``.
Only the standard library: the launcher imports no torch, and a rank installs its handler
before it imports torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import ClassVar

from qwen3_trainium.shared.stopfiles import FAST, GRACEFUL, exit_code, signal_name, write_json

KILL_AFTER_S = 10.0  # after a fast signal, what torchrun has not stopped by then is SIGKILLed
POLL_S = 0.2  # how often the launcher looks at the clock while torchrun runs
TORCHRUN_SIGNALS = "SIGINT,SIGHUP,SIGQUIT"  # torchrun's default list less SIGTERM


class Interrupted(BaseException):
    """A stop signal before torchrun started. A BaseException, as KeyboardInterrupt is, so that
    no ``except Exception`` on the way (pre-flight) takes it for a failed check."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal_name(signum)} before the ranks started")
        self.signum = signum


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (torchrun's workers), from ``/proc`` (Linux)."""
    children = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # field 2 (the command) is parenthesised and may hold spaces; the parent pid follows the state
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry))
    return children


def _kill(pid: int, signum: int, *, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, signum)


def ignore_sigterm() -> None:
    """torchrun's ``preexec_fn``: it and its workers start with SIGTERM ignored (a rank installs
    its own handler; torchrun, not handling SIGTERM by ``PET_SIGNALS_TO_HANDLE``, keeps ignoring it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def torchrun_env(environ=os.environ) -> dict[str, str]:
    listed = environ.get("PET_SIGNALS_TO_HANDLE", TORCHRUN_SIGNALS)
    kept = [s for s in listed.split(",") if s.strip() and s.strip() != "SIGTERM"]
    return {"PET_SIGNALS_TO_HANDLE": ",".join(kept)}


class LauncherSignals:
    """SIGTERM, SIGINT, SIGHUP and SIGQUIT while the launcher runs one job (module docstring).
    Signal handlers belong to the process: one instance at a time, found as ``current``."""

    current: ClassVar[LauncherSignals | None] = None
    HANDLED = (GRACEFUL, *FAST)

    def __init__(self) -> None:
        self.first: int | None = None  # the first signal received
        self.process = None  # torchrun, once started
        self.request: str | None = None
        self._starting = False
        self._fast_at: float | None = None
        self._ranks: list[int] = []  # torchrun's workers when a fast signal came
        self._previous: dict = {}

    def __enter__(self) -> LauncherSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in self.HANDLED}
            LauncherSignals.current = self
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if LauncherSignals.current is self:
            LauncherSignals.current = None

    def _on_signal(self, signum: int, frame) -> None:
        self.first = self.first or signum
        if self.process is not None:
            self._pass_on(signum)
        outer = self._previous.get(signum)
        if callable(outer) and outer is not signal.default_int_handler:
            outer(signum, frame)  # a handler installed around the job (Slurm requeue's) still hears it
        if self.process is None and not self._starting:
            raise Interrupted(signum)
        # while torchrun is being started, attach() passes the signal on

    @contextlib.contextmanager
    def starting(self, request: str | None):
        """Around torchrun's start: a signal that came before ends the job; one that comes during
        it is passed on once torchrun is attached."""
        if self.first is not None:
            raise Interrupted(self.first)
        self.request, self._starting = request, True
        try:
            yield self
        finally:
            self._starting = False

    def attach(self, process) -> None:
        self.process = process
        if self.first is not None:
            self._pass_on(self.first)

    def _pass_on(self, signum: int) -> None:
        if self.process.returncode is not None:
            return  # torchrun is gone (and its pid may be reused)
        if self._fast_at is not None:
            self.kill_all()  # a second signal after a fast one
        elif signum == GRACEFUL:
            if self.request:
                write_json(self.request, {"signal": int(signum), "at": time.time()})
            for pid in child_pids(self.process.pid):
                _kill(pid, signum)
        else:
            self._fast_at = time.monotonic()
            _kill(self.process.pid, signal.SIGSTOP)
            self._ranks = child_pids(self.process.pid)
            for pid in self._ranks:
                _kill(pid, signal.SIGINT, group=True)

    def tick(self) -> None:
        """Called while waiting for torchrun: after a fast signal, SIGKILL the frozen torchrun once
        its ranks have left (their parent-death signal, ``lifeline.py``, would SIGKILL a rank
        still unwinding), or everything once the grace is over."""
        if self._fast_at is None or self.process.returncode is not None:
            if self._fast_at is not None and time.monotonic() - self._fast_at > KILL_AFTER_S:
                self.kill_all()
            return
        if time.monotonic() - self._fast_at > KILL_AFTER_S or not any(_alive(p) for p in self._ranks):
            self.kill_all()

    def reap(self) -> None:
        """After torchrun is gone: wait for the ranks a fast signal stopped (SIGKILL at the grace's end)."""
        while self._fast_at is not None and any(_alive(pid) for pid in self._ranks):
            self.tick()
            time.sleep(POLL_S / 4)

    def kill_all(self) -> None:
        """SIGKILL every rank's process group (each rank leads its own: torch's
        ``SubprocessHandler._popen`` starts it with ``start_new_session=True``), then torchrun's."""
        if self.process is None:
            return
        ranks = self._ranks if self.process.returncode is not None else child_pids(self.process.pid)
        for pid in ranks:
            _kill(pid, signal.SIGKILL, group=True)
        if self.process.returncode is None:
            _kill(self.process.pid, signal.SIGKILL, group=True)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: its exit is only waiting to be collected)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def outcome(code: int, marker: dict | None, signals: LauncherSignals | None) -> tuple[str, int]:
    """(status, exit code) of a run torchrun ended with ``code``: ``interrupted`` and 128 + the
    signal when the launcher or a rank was asked to stop, unless the run finished all its steps
    first (torchrun exited 0 and the ranks recorded no early stop)."""
    signum = (signals.first if signals else None) or (marker or {}).get("signal")
    if signum is None or (code == 0 and marker is None):
        return ("ok" if code == 0 else "failed"), code
    return "interrupted", exit_code(int(signum))


def describe(marker: dict | None, code: int) -> str:
    """The launcher's last line about an interrupted run."""
    if marker is None:
        how = "before the ranks reached a step boundary" if code - 128 == GRACEFUL else "at once"
        return f"stopped by {signal_name(code - 128)} {how}, nothing saved at the stop (exit {code})"
    if marker.get("checkpoint_step") is not None:
        saved = f"checkpoint at step {marker['checkpoint_step']}: the same command resumes from it"
    else:
        saved = "no checkpoint saved at the stop"
    return f"stopped by {marker['signal_name']} after step {marker['step']}, {saved} (exit {code})"
