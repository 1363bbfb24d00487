"""One job, from a composed Hydra config to a finished run: resolve, check (``verdicts.py``),
start torchrun (``argv.py``, ``processes.py``), judge the run. ``hydra_task`` is what
``launch.py`` calls, once per job (a sweep's too).
"""

from __future__ import annotations

import math
import os
import shlex
import sys
import time
import traceback
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from qwen3_trainium.config import nodes, runconfig
from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent import compose, preflight, report, signals, tracking
from qwen3_trainium.parent.argv import describe, rank_env, torchrun_argv
from qwen3_trainium.parent.processes import Started, finish, start, use_progress
from qwen3_trainium.parent.verdicts import Preflight, after_run, refuse
from qwen3_trainium.shared import gate, stopfiles


@dataclass(frozen=True)
class Job:
    """What Hydra knows of one job: where it runs, what the user overrode, which sweep it is in."""

    run_dir: str
    launch_dir: str
    run_name: str = "default"
    overrides: tuple[str, ...] = ()
    choices: dict[str, str] = field(default_factory=dict)
    sweep_dir: str | None = None  # multirun only
    num: int = 0

    @classmethod
    def from_hydra(cls, hydra_cfg, launch_dir: str) -> Job:
        from hydra.types import RunMode

        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        choices = {k: str(v) for k, v in hydra_cfg.runtime.choices.items() if v is not None}
        return cls(
            run_dir=hydra_cfg.runtime.output_dir,
            launch_dir=launch_dir,
            run_name=hydra_cfg.job.override_dirname or "default",
            overrides=tuple(hydra_cfg.overrides.task),
            choices=choices,
            sweep_dir=os.path.join(launch_dir, hydra_cfg.sweep.dir) if multirun else None,
            num=OmegaConf.select(hydra_cfg, "job.num", default=0),
        )


def _run_job(cfg: DictConfig, job: Job) -> tuple[str, int]:
    """(status, exit code) of resolving, checking, describing or launching one job.

    Nothing starts before every check passed, except in one case: the checks that need no torch
    passed and the rest must run (not remembered). Then torchrun starts at once and the rest runs
    here while the ranks import torch; they wait for the verdict before touching a device
    (``gate.py``), and a refusal ends the job with the same message and exit code 2."""
    unset = preflight.unknown_keys(cfg) + preflight.missing_values(cfg)
    if unset:
        return refuse(unset)
    run = compose.resolve(cfg, job.launch_dir)
    run.run_name = run.run_name or job.run_name
    if run.doctor:
        from qwen3_trainium.parent import doctor

        healthy, text = doctor.report(run, job.launch_dir, tty=sys.stdout.isatty())
        print(text)
        return ("ok", 0) if healthy else ("failed", 1)
    if run.parallel.auto:  # the layout is planned first (parent/auto): every check is of the winner
        from qwen3_trainium.parent import auto

        run, problems = auto.choose(run, job.run_dir)
        if problems:
            return refuse(problems)
    machine = preflight.check_machine(
        run, job.run_dir, launching=not run.dry_run, layout=job.choices.get("parallel", "")
    )
    if machine:  # with the config's own problems, if any: all of them at once
        return refuse(machine + preflight.check_static(run, job.run_dir, launching=not run.dry_run))
    checks = Preflight(run, job.run_dir, launching=not run.dry_run)
    overlap = (
        not run.dry_run and not checks.cached and not preflight.check_static(run, job.run_dir, launching=True)
    )
    if not overlap:
        problems = checks.problems()
        if problems:
            return refuse(problems)
        checks.print_notes()
        _preview(run, job.run_dir)
    lead = run.launcher.node_rank == 0  # of several nodes, node 0 records the job
    if run.tracking.wandb and lead:
        create = not run.dry_run
        tracking.fill_identity(run, job.run_dir, choices=job.choices, sweep_dir=job.sweep_dir, create=create)
    argv, env = torchrun_argv(run, job.run_dir), rank_env(run, job.run_dir, dict(os.environ))
    if run.dry_run:
        print(describe(run, argv, env))
        return "dry_run", 0
    if overlap:
        return _overlapped(run, job, checks, argv, env, lead)
    if lead:
        _record_start(run, job.run_dir, checks.versions)
    compose.save(run, job.run_dir)
    return _run_to_end(run, job, _start(run, job, argv, env), lead)


def _preview(run: RunConf, run_dir: str) -> None:
    """data.preview=N (chat and preference data): the first N rows rank 0 trains on, written
    before it starts (a preference row shows each pair's prompt and both completions)."""
    if run.data.preview <= 0 or run.data.format.value == "text" or run.launcher.node_rank > 0:
        return
    from qwen3_trainium.parent.preflight.chat import dp_ranks

    if run.data.format.value == "preference":
        from qwen3_trainium.data.preference import source
    else:
        from qwen3_trainium.data.chat import source

    md, jsonl = source.write_preview(run, run_dir, run.data.preview, world=dp_ranks(run))
    print(f"[qwen3-trainium] data preview: {md} and {jsonl}", flush=True)


def _record_start(run: RunConf, run_dir: str, versions: dict[str, str]) -> None:
    report.update_job(run_dir, run_name=run.run_name, versions=versions, git_commit=tracking.git_commit())


def _start(run: RunConf, job: Job, argv: list[str], env: dict[str, str]) -> Started:
    print(f"[qwen3-trainium] run directory: {job.run_dir}", flush=True)
    print(f"[qwen3-trainium] {shlex.join(argv)}", flush=True)
    progress = use_progress(run.launcher.progress, sys.stdout.isatty())
    # a stop asked of an earlier run of this directory (a resume's) is not this run's
    request = stopfiles.request_path(job.run_dir, run.launcher.node_rank)
    stopfiles.remove(request, *([stopfiles.marker_path(job.run_dir)] if run.launcher.node_rank == 0 else []))
    env = {**env, stopfiles.REQUEST_ENV: request}
    return start(argv, env, run_dir=job.run_dir, progress=progress)


def _run_to_end(run: RunConf, job: Job, started: Started, lead: bool) -> tuple[str, int]:
    """Wait for torchrun; on the lead node the loss plot (drawn while torchrun shuts down)."""
    plotter = report.RunPlotter(job.run_dir, run.run_name, run.training.steps) if lead else None
    code = finish(started, run_dir=job.run_dir, total_steps=run.training.steps)
    return after_run(run, job.run_dir, code, plotter)


def _overlapped(run: RunConf, job: Job, checks: Preflight, argv, env, lead: bool) -> tuple[str, int]:
    """torchrun first, pre-flight meanwhile. The ranks read a staged copy of the resolved config,
    so a refused run leaves the run directory's own ``resolved.yaml`` (a resume's) untouched."""
    name = runconfig.resolved_name(run.launcher.node_rank)
    staged = name.replace(".yaml", ".staged.yaml")
    verdict = gate.verdict_path(job.run_dir, run.launcher.node_rank)
    compose.save(run, job.run_dir, name=staged)
    if os.path.exists(verdict):
        os.remove(verdict)  # a verdict from an earlier run of this directory
    env = {
        **env,
        runconfig.RESOLVED_ENV: staged,
        gate.VERDICT_ENV: verdict,
    }
    started = _start(run, job, argv, env)
    try:
        try:
            problems = checks.problems()
        except BaseException:
            gate.write(verdict, ok=False)
            started.process.wait()
            raise
        if problems:
            gate.write(verdict, ok=False, problems=len(problems))
            started.process.wait()  # the ranks exit at the gate (those still importing, once there)
            if started.log is not None:
                started.log.close()
            return refuse(problems, ranks_started=True)
        if lead:
            _record_start(run, job.run_dir, checks.versions)
        compose.save(run, job.run_dir)
        gate.write(verdict, ok=True)
        checks.print_notes()
        _preview(run, job.run_dir)
        return _run_to_end(run, job, started, lead)
    finally:
        for path in (os.path.join(job.run_dir, staged), verdict):
            if os.path.exists(path):
                os.remove(path)


def run_job(cfg: DictConfig, job: Job) -> int:
    """One job, recorded in ``<run_dir>/job.json`` (status, exit code, wall time) for summaries
    by its first node (every node of a multi-node job runs this, one torchrun each).
    A stop signal (``signals.py``) ends the whole command with 128 + the signal, a sweep too."""
    with signals.LauncherSignals():
        status, code = _recorded_job(cfg, job)
    if status == "interrupted":
        raise SystemExit(code)
    return code


def _recorded_job(cfg: DictConfig, job: Job) -> tuple[str, int]:
    lead = nodes.node_rank(OmegaConf.select(cfg, "launcher.node_rank", default=-1), dict(os.environ)) == 0
    start = time.monotonic()
    status, code = "failed", 1
    try:
        if lead:
            report.update_job(
                job.run_dir,
                job_num=job.num,
                overrides=list(job.overrides),
                total_steps=OmegaConf.select(cfg, "training.steps", default=None),
                objective=report.objective_key(_eval_enabled(cfg), _dpo(cfg)),
                status="running",
                started_at=time.time(),
                stop=None,  # a resumed run's earlier stop
            )
        status, code = _run_job(cfg, job)
    except signals.Interrupted as stopped:
        print(f"[qwen3-trainium] {stopped}", file=sys.stderr, flush=True)
        status, code = "interrupted", stopfiles.exit_code(stopped.signum)
    finally:
        if lead:
            wall_s = time.monotonic() - start
            report.update_job(
                job.run_dir, status=status, exit_code=code, wall_s=wall_s, **report.final_metrics(job.run_dir)
            )
    return status, code


def _eval_enabled(cfg: DictConfig) -> bool:
    return bool(OmegaConf.select(cfg, "eval.enable", default=False))


def _dpo(cfg: DictConfig) -> bool:
    kind = OmegaConf.select(cfg, "objective.kind", default="sft")
    return getattr(kind, "value", kind) == "dpo"


def objective(cfg: DictConfig, run_dir: str) -> float | None:
    """The value a job returns to sweepers: its final held-out loss with eval=on (objective=dpo:
    its held-out preference accuracy), else its final training loss (``job.json`` and the sweep
    summary's ``objective`` column say which); None when the run logged none."""
    value = report.final_loss(run_dir, report.objective_key(_eval_enabled(cfg), _dpo(cfg)))
    return None if math.isnan(value) else value


def hydra_task(cfg: DictConfig) -> float | None:
    """The body of ``launch.py``'s ``@hydra.main``. A single run exits with the job's status; in a
    multirun a failed job (even one that raised) is recorded and the sweep goes on. Returns the
    final held-out loss (eval=on) or training loss, the objective of sweepers such as Optuna;
    None for a failed job, or one that logged no such loss, which Optuna records as a failed
    trial (a NaN would make optuna 2.10 raise in ``study.tell``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    job = Job.from_hydra(hydra_cfg, os.getcwd())
    if hydra_cfg.mode == RunMode.RUN:
        code = run_job(cfg, job)
        if code != 0:
            sys.exit(code)
        return objective(cfg, job.run_dir)
    try:
        code = run_job(cfg, job)
    except Exception:
        traceback.print_exc()  # a bug, shown in full; recorded as failed and the sweep goes on
        code = 1
    return objective(cfg, job.run_dir) if code == 0 else None
