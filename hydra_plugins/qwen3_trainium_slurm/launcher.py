"""hydra-submitit-launcher's ``SlurmLauncher`` (selected by ``cluster=slurm_*``), plus:

- ``dry_run=true``: print each job's sbatch script and what every node will run (our own dry run
  of the job), and submit nothing. It needs no Slurm command, so it works on a laptop.
- Without Slurm's commands on PATH a submission stops with one line naming what is missing.
- Requeue on preemption and at the time limit (``requeue.py``), the job resuming from its
  latest checkpoint in the same run directory.
- A job that Slurm ended for good without a result (cancelled, out of requeues, killed) is a
  failed job of the sweep summary, not a traceback that ends the sweep.

It lives in the ``hydra_plugins`` namespace because Hydra instantiates launchers only from
there. One Slurm job per sweep job, ``tasks_per_node: 1`` (one torchrun per node, every node
running the Hydra job).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Any
from unittest import mock

from hydra.core.utils import JobReturn, JobStatus, run_job
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.qwen3_trainium_slurm import requeue

SUBMIT_COMMANDS = ("sbatch", "srun")  # srun: submitit refuses to build its executor without it


def missing_commands(path: str | None = None) -> list[str]:
    return [command for command in SUBMIT_COMMANDS if shutil.which(command, path=path) is None]


def _without_srun_probe(auto_executor: type, **kwargs: Any) -> Any:
    """``submitit.AutoExecutor(cluster="slurm", ...)`` on a machine without Slurm, for a dry run.
    submitit 1.5.4, ``submitit/slurm/slurm.py`` line 256, ``SlurmExecutor.__init__``:
    ``if not self.affinity() > 0: raise RuntimeError('Could not detect "srun", ...')``, where
    ``affinity()`` is ``-1 if shutil.which("srun") is None else 2`` (line 384). The probe is
    answered only while the executor is built; a dry run renders scripts and never submits."""
    from submitit.slurm.slurm import SlurmExecutor

    with mock.patch.object(SlurmExecutor, "affinity", classmethod(lambda cls: 2)):
        return auto_executor(**kwargs)


class _Done:
    def __init__(self, ret: JobReturn) -> None:
        self._ret = ret

    def results(self) -> list[JobReturn]:
        return [self._ret]


class _Settled:
    """A submitted job's ``results()``; when Slurm ended it without a result (submitit raises
    UncompletedJobError, or FailedJobError for a job that raised), a failed job instead."""

    def __init__(self, launcher: Qwen3SlurmLauncher, job: Any, overrides: list[str], num: int) -> None:
        self._launcher, self._job, self._overrides, self._num = launcher, job, overrides, num

    def results(self) -> list[JobReturn]:
        from submitit.core.utils import FailedJobError, UncompletedJobError

        try:
            return self._job.results()
        except (UncompletedJobError, FailedJobError) as error:
            return [self._launcher.failed_without_result(self._job, self._overrides, self._num, error)]


class _Executor:
    """Stands in for ``submitit.AutoExecutor`` in the upstream ``launch``, with the same
    parameters: a dry run renders the sbatch file instead of submitting; a real run's jobs are
    settled (``_Settled``)."""

    def __init__(
        self, launcher: Qwen3SlurmLauncher, auto_executor: type, dry_run: bool, **kwargs: Any
    ) -> None:
        self._launcher, self._dry_run = launcher, dry_run
        self._real = _without_srun_probe(auto_executor, **kwargs) if dry_run else auto_executor(**kwargs)

    def update_parameters(self, **params: Any) -> None:
        self._real.update_parameters(**params)

    def map_array(self, fn: Any, *iterables: Any) -> list[Any]:
        jobs = [(list(overrides), num) for overrides, _key, num, _id, _state in zip(*iterables, strict=True)]
        if self._dry_run:
            return [self._render(overrides, num) for overrides, num in jobs]
        from submitit.core.utils import FailedJobError

        try:  # one sbatch for the whole array (submitit's job array): on a refusal none was submitted
            submitted = self._real.map_array(fn, *iterables)
        except (FailedJobError, subprocess.CalledProcessError) as e:
            said = (str(e) if isinstance(e, FailedJobError) else e.stderr or "").strip().splitlines()
            print(
                f"qwen3-trainium: sbatch refused the submission ({said[-1] if said else 'no message'}):"
                " check hydra.launcher.partition and that this host reaches the Slurm controller"
                " (sinfo), or add dry_run=true to render the scripts here (nothing was submitted)",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(2) from None
        return [_Settled(self._launcher, job, *spec) for job, spec in zip(submitted, jobs, strict=True)]

    def _render(self, overrides: list[str], num: int) -> _Done:
        slurm = self._real._executor  # submitit's SlurmExecutor: renders the sbatch file it would submit
        script = slurm._make_submission_file_text(slurm._submitit_command_str, "dry-run")
        print(
            f"# job #{num}: {' '.join(overrides)}\n# sbatch script (dry run: not submitted)\n{script}",
            flush=True,
        )
        return _Done(self._launcher.run_locally(overrides, num))


class Qwen3SlurmLauncher(SlurmLauncher):
    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        asked = (self.params.get("additional_parameters") or {}).get("signal")
        self.params = requeue.sbatch_params(self.params)
        if asked and asked != self.params["additional_parameters"]["signal"]:
            print(
                f"[qwen3-trainium] warning: hydra.launcher.additional_parameters.signal={asked} is replaced"
                f" by {self.params['additional_parameters']['signal']}: the requeue before the time limit"
                " needs SIGURG (set how early with hydra.launcher.signal_delay_s)",
                file=sys.stderr,
                flush=True,
            )

    def _job_config(self, overrides: list[str], num: int, job_id: str) -> DictConfig:
        assert self.hydra_context is not None and self.config is not None
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(sweep_config.hydra.job) as job:
            job.id = job_id
            job.num = num
        return sweep_config

    def run_locally(self, overrides: list[str], num: int) -> JobReturn:
        """The job's own dry run, here: the resolved config and the torchrun line of each node."""
        assert self.hydra_context is not None and self.task_function is not None
        return run_job(
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=self._job_config(overrides, num, "dry-run"),
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )

    def failed_without_result(self, job: Any, overrides: list[str], num: int, error: Exception) -> JobReturn:
        """Record the job as failed in its ``job.json`` (what the sweep summary reads) and return
        what ``launch.py`` returns for a failed job (None), so the sweep goes on."""
        from qwen3_trainium.parent import report

        config = self._job_config(overrides, num, job.job_id)
        run_dir = os.path.abspath(os.path.join(str(config.hydra.sweep.dir), str(config.hydra.sweep.subdir)))
        state = job.state
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(
            f"[qwen3-trainium] job #{num}: Slurm job {job.job_id} ended {state} without a result"
            f" ({reason}); its log: {job.paths.stderr}",
            file=sys.stderr,
            flush=True,
        )
        report.update_job(
            run_dir,
            job_num=num,
            overrides=overrides,
            status="failed",
            slurm_job_id=job.job_id,
            slurm_state=state,
        )
        return JobReturn(overrides=overrides, status=JobStatus.COMPLETED, _return_value=None)

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        """In each task of the Slurm job: the Hydra job, unless Slurm ends this attempt first."""
        attempt = requeue.Attempt.watch()
        ret = super().__call__(*args, **kwargs)
        run_dir = (
            None if ret.hydra_cfg is None else OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir")
        )
        if attempt.ended_by and not requeue.trained_to_the_end(run_dir):
            # no result pickle: the submitting process polls on, for the next attempt's result
            raise SystemExit(
                f"[qwen3-trainium] attempt ended ({attempt.ended_by}) before the last step: no result"
            )
        return ret

    def launch(self, job_overrides, initial_job_idx):
        assert self.config is not None
        dry_run = bool(OmegaConf.select(self.config, "dry_run", default=False))
        missing = [] if dry_run else missing_commands()
        if missing:
            print(
                f"qwen3-trainium: {' and '.join(missing)} not found on PATH: submit from a Slurm login"
                " node, or add dry_run=true to render the scripts here (nothing was submitted)",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(2)
        import submitit

        stand_in = functools.partial(_Executor, self, submitit.AutoExecutor, dry_run)
        with mock.patch.object(submitit, "AutoExecutor", stand_in):
            return super().launch(job_overrides, initial_job_idx)
