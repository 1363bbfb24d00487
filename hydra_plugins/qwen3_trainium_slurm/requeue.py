"""Requeue on preemption and at the time limit: the sbatch side and the side inside each job.

Two ways an attempt is ended early, two mechanisms (docs/slurm.md, "Requeue"):

- Slurm requeues the job itself (``#SBATCH --requeue``: ``scontrol requeue``, preemption with
  ``PreemptMode=REQUEUE``, node failure): it sends SIGTERM to every process of the job, SIGKILL
  ``KillWait`` seconds later, and runs the batch script again from its beginning; submitit's
  ``python -m submitit.core._submit`` loads the same pickled job, so the same Hydra job runs
  in the same run directory and torchtitan resumes from the latest checkpoint there.
- Before the time limit (which Slurm never requeues), submitit's checkpoint-and-requeue protocol
  (``submitit/core/job_environment.py``, ``SignalHandler.checkpoint_and_try_requeue``): on the
  warning signal, task 0 pickles ``launcher.checkpoint()`` (the same job, one timeout fewer
  left of ``max_num_timeout``) and runs ``scontrol requeue`` (``submitit/slurm/slurm.py``,
  ``SlurmJobEnvironment._requeue``); from there it is the first case.

Two changes to submitit's defaults make that safe with torchrun under each task:

- The warning is SIGURG, not submitit's USR2. ``--signal`` without ``B:`` signals every process
  of the job's steps (measured on this project's test cluster: grandchildren too), and USR2's
  default action kills torchrun and the ranks on the spot; SIGURG's default is to ignore it.
  ``SUBMITIT_PREEMPT_SIGNAL`` is submitit's own switch (``JobEnvironment.USR_SIG``).
- An attempt that Slurm ends reports no result (unless it trained to its last step): the
  submitting process then keeps polling, and gets the next attempt's result. submitit would
  exit at once after requeueing (``SignalHandler._exit``: ``sys.exit(-1)``); here the launcher
  keeps waiting for torchrun, which the requeue's SIGTERM stops, so the ranks end on their own
  terms within ``KillWait``.
"""

from __future__ import annotations

import functools
import os
import signal
from typing import Any

WARNING_SIGNAL = "URG"
PREEMPT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"  # read by submitit/core/job_environment.py at import


def sbatch_params(params: dict[str, Any]) -> dict[str, Any]:
    """hydra-submitit-launcher's parameters with the time-limit warning made SIGURG: the sbatch
    ``--signal`` (which submitit writes as ``USR2@signal_delay_s``, ``additional_parameters``
    winning) and the job's submitit, through the script's setup lines."""
    export = f"export {PREEMPT_SIGNAL_ENV}={WARNING_SIGNAL}"
    setup = list(params.get("setup") or [])
    extra = dict(params.get("additional_parameters") or {})
    extra["signal"] = f"{WARNING_SIGNAL}@{params.get('signal_delay_s', 120)}"
    return {**params, "additional_parameters": extra, "setup": setup if export in setup else [export, *setup]}


def _say(message: str) -> None:
    # os.write, not print: this runs in signal handlers, and print may be mid-write already
    os.write(2, f"[qwen3-trainium] {message}\n".encode())


class Attempt:
    """One Slurm attempt of a job, inside one of its tasks: whether Slurm is ending it."""

    def __init__(self) -> None:
        self.ended_by: str | None = None

    @classmethod
    def watch(cls) -> Attempt:
        """Take over submitit's handlers (installed before the job runs: ``process_job``)."""
        import submitit

        attempt = cls()
        warning = getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG)
        submitits = signal.getsignal(warning)
        if callable(submitits):
            signal.signal(warning, functools.partial(attempt._on_warning, submitits))
        signal.signal(signal.SIGTERM, attempt._on_sigterm)  # submitit's only logs it
        return attempt

    def _on_warning(self, submitits, signum: int, frame: Any) -> None:
        try:
            submitits(signum, frame)  # task 0: checkpoint() pickled, scontrol requeue, sys.exit
        except SystemExit:
            self.ended_by = "requeued by submitit before the time limit"
            _say(f"{self.ended_by}: waiting for torchrun, which the requeue stops with SIGTERM")
        except Exception as error:  # max_num_timeout spent, or scontrol failed: not requeued
            _say(f"not requeued ({error}); the run goes on until Slurm's time limit")

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.ended_by = self.ended_by or "SIGTERM from Slurm"
        _say("SIGTERM: Slurm is ending this attempt (requeue, preemption, cancel or time limit)")


def trained_to_the_end(run_dir: str | None) -> bool:
    """Whether the run's metrics reached its last step (a run ended by Slurm may still have)."""
    from qwen3_trainium.parent import report

    if not run_dir:
        return False
    total = report.read_json(os.path.join(run_dir, report.JOB_NAME)).get("total_steps")
    rows = report.read_metrics(run_dir)
    return isinstance(total, int) and bool(rows) and rows[-1]["step"] >= total
