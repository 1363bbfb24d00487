"""hydra-submitit-launcher's ``SlurmLauncher``, plus ``dry_run=true``: print each job's sbatch
script and what every node will run (our own dry run of the job), and submit nothing.

It lives in the ``hydra_plugins`` namespace because Hydra instantiates launchers only from
there. Without ``dry_run`` it is the upstream launcher unchanged: one Slurm job per sweep job,
``tasks_per_node: 1`` (one torchrun per node, every node running the Hydra job).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from hydra.core.utils import JobReturn, run_job
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf, open_dict


class _Done:
    def __init__(self, ret: JobReturn) -> None:
        self._ret = ret

    def results(self) -> list[JobReturn]:
        return [self._ret]


class _DryRunExecutor:
    """Stands in for ``submitit.AutoExecutor``: the same parameters, no submission."""

    def __init__(self, launcher: Qwen3SlurmLauncher, real_cls: type, **kwargs: Any) -> None:
        self._launcher = launcher
        self._real = real_cls(**kwargs)

    def update_parameters(self, **params: Any) -> None:
        self._real.update_parameters(**params)

    def map_array(self, _fn: Any, *iterables: Any) -> list[_Done]:
        slurm = self._real._executor  # submitit's SlurmExecutor: renders the sbatch file it would submit
        done = []
        for overrides, _key, num, _job_id, _state in zip(*iterables, strict=True):
            script = slurm._make_submission_file_text(slurm._submitit_command_str, "dry-run")
            print(
                f"# job #{num}: {' '.join(overrides)}\n# sbatch script (dry run: not submitted)\n{script}",
                flush=True,
            )
            done.append(_Done(self._launcher.run_locally(list(overrides), num)))
        return done


class Qwen3SlurmLauncher(SlurmLauncher):
    def run_locally(self, overrides: list[str], num: int) -> JobReturn:
        """The job's own dry run, here: the resolved config and the torchrun line of each node."""
        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(sweep_config.hydra.job) as job:
            job.id = "dry-run"
            job.num = num
        return run_job(
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )

    def launch(self, job_overrides, initial_job_idx):
        assert self.config is not None
        if not OmegaConf.select(self.config, "dry_run", default=False):
            return super().launch(job_overrides, initial_job_idx)
        import submitit

        real = submitit.AutoExecutor

        def executor(**kwargs: Any) -> _DryRunExecutor:
            return _DryRunExecutor(self, real, **kwargs)

        with mock.patch.object(submitit, "AutoExecutor", executor):
            return super().launch(job_overrides, initial_job_idx)
