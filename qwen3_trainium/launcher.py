"""From a composed Hydra config to a running torchrun: argv and env (pure) + launch (impure).

One launch form for every path and device, the guide's:
``torchrun --nproc_per_node=N --rdzv_backend c10d --rdzv_endpoint localhost:0 ...``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from qwen3_trainium import devices, nodes, preflight, report, runconfig, titan, tracking
from qwen3_trainium.schema import Progress, RunConf
from qwen3_trainium.titan import CONFIG_FUNCTION, CONFIG_MODULE, RUN_DIR_ENV

RANK_ENTRY = "qwen3_trainium.train"
TORCHRUN_LOG = "torchrun.log"
TAIL_LINES = 40


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


def torchrun_executable() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return beside if os.path.exists(beside) else "torchrun"


def torchrun_argv(run: RunConf, run_dir: str) -> list[str]:
    launcher = run.launcher
    return [
        torchrun_executable(),
        f"--nnodes={launcher.nnodes}",
        f"--nproc_per_node={launcher.nproc_per_node}",
        *nodes.rdzv_args(launcher),
        "--local-ranks-filter",
        str(launcher.log_rank),
        "--role",
        "rank",
        "--tee",
        "3",
        "--log-dir",
        os.path.join(run_dir, "logs"),
        "-m",
        RANK_ENTRY,
        "--module",
        CONFIG_MODULE,
        "--config",
        CONFIG_FUNCTION,
    ]


def rank_env(run: RunConf, run_dir: str, environ: dict[str, str]) -> dict[str, str]:
    """The variables the launcher adds to (or changes in) the parent's environment."""
    env = {
        RUN_DIR_ENV: run_dir,
        runconfig.RESOLVED_ENV: runconfig.resolved_name(run.launcher.node_rank),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    env.update(
        devices.rank_env(
            run.device.type.value,
            nproc_per_node=run.launcher.nproc_per_node,
            lnc=run.device.lnc,
            compile_cache=run.device.compile_cache,
        )
    )
    env.update(nodes.node_env(run.launcher, run.device.type.value))
    env.update(tracking.wandb_env(run, environ))
    return env


def describe(run: RunConf, argv: list[str], env: dict[str, str]) -> str:
    lines = ["# resolved config", runconfig.to_yaml(run).rstrip(), ""]
    lines += ["# override.imports (applied by torchtitan in each rank, in this order)"]
    lines += [f"- {entry}" for entry in titan.override_imports(run)] or ["(none)"]
    lines += ["", "# torchrun command"]
    if run.launcher.nnodes > 1:
        lines[-1] += (
            f" (on each of the {run.launcher.nnodes} nodes, one task per node;"
            f" rendezvous on {nodes.shown_endpoint(run.launcher)})"
        )
    lines.append(shlex.join(argv))
    lines += ["", "# environment (added to the current one)"]
    lines += [f"{key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    return "\n".join(lines)


def use_progress(mode: Progress, tty: bool) -> bool:
    return mode is Progress.on or (mode is Progress.auto and tty)


def _tail(path: str, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def launch(argv: list[str], env: dict[str, str], *, run_dir: str, total_steps: int, progress: bool) -> int:
    """Run torchrun; return its exit status. Without ``progress`` rank 0's output streams to the
    terminal; with it, torchrun's output goes to ``<run_dir>/torchrun.log`` and one live line
    shows steps, loss, tokens/s and ETA (the log's tail is printed if the run fails)."""
    full_env = {**os.environ, **env}
    if not progress:
        return subprocess.run(argv, env=full_env, check=False).returncode
    from qwen3_trainium.progress import ProgressLine

    log_path = os.path.join(run_dir, TORCHRUN_LOG)
    print(f"[qwen3-trainium] rank 0's output: {log_path} (every rank: {run_dir}/logs)", flush=True)
    with open(log_path, "w") as log, ProgressLine(run_dir, total_steps, sys.stdout):
        code = subprocess.run(
            argv, env=full_env, stdout=log, stderr=subprocess.STDOUT, check=False
        ).returncode
    if code != 0:
        print(f"[qwen3-trainium] torchrun exited {code}; the end of {log_path}:", file=sys.stderr)
        print(_tail(log_path), file=sys.stderr, end="", flush=True)
    return code


def _run_job(cfg: DictConfig, job: Job) -> tuple[str, int]:
    """(status, exit code) of resolving, checking, describing or launching one job."""
    missing = preflight.missing_values(cfg)
    if missing:
        print(preflight.format_problems(missing), file=sys.stderr)
        return "failed", 2
    run = runconfig.resolve(cfg, job.launch_dir)
    run.run_name = run.run_name or job.run_name
    if run.doctor:
        from qwen3_trainium import doctor

        healthy, text = doctor.report(run, job.launch_dir, tty=sys.stdout.isatty())
        print(text)
        return ("ok", 0) if healthy else ("failed", 1)
    notes: list[str] = []
    problems = preflight.check(run, job.run_dir, launching=not run.dry_run, notes=notes)
    if problems:
        print(preflight.format_problems(problems), file=sys.stderr)
        return "failed", 2
    for note in notes:
        print(f"[qwen3-trainium] {note}", flush=True)
    lead = run.launcher.node_rank == 0  # of several nodes, node 0 records the job
    if run.tracking.wandb and lead:
        create = not run.dry_run
        tracking.fill_identity(run, job.run_dir, choices=job.choices, sweep_dir=job.sweep_dir, create=create)
    argv, env = torchrun_argv(run, job.run_dir), rank_env(run, job.run_dir, dict(os.environ))
    if run.dry_run:
        print(describe(run, argv, env))
        return "dry_run", 0
    if lead:
        report.update_job(
            job.run_dir,
            run_name=run.run_name,
            versions=preflight.installed_versions(run),
            git_commit=tracking.git_commit(),
        )
    runconfig.save(run, job.run_dir)
    print(f"[qwen3-trainium] run directory: {job.run_dir}", flush=True)
    print(f"[qwen3-trainium] {shlex.join(argv)}", flush=True)
    progress = use_progress(run.launcher.progress, sys.stdout.isatty())
    code = launch(argv, env, run_dir=job.run_dir, total_steps=run.training.steps, progress=progress)
    if not lead:
        return ("ok" if code == 0 else "failed"), code
    report.plot_run(job.run_dir, run.run_name)
    if code == 0 and run.checkpoint.enable and run.checkpoint.last_save_in_hf and run.checkpoint.export_check:
        from qwen3_trainium import export_check

        passed, line = export_check.verify(run, job.run_dir)
        print(f"[qwen3-trainium] {line}", flush=True)
        code = 0 if passed else 3
    return ("ok" if code == 0 else "failed"), code


def run_job(cfg: DictConfig, job: Job) -> int:
    """One job, recorded in ``<run_dir>/job.json`` (status, exit code, wall time) for summaries
    by its first node (every node of a multi-node job runs this, one torchrun each)."""
    if nodes.node_rank(OmegaConf.select(cfg, "launcher.node_rank", default=-1), dict(os.environ)) != 0:
        return _run_job(cfg, job)[1]
    start = time.monotonic()
    report.update_job(
        job.run_dir,
        job_num=job.num,
        overrides=list(job.overrides),
        total_steps=OmegaConf.select(cfg, "training.steps", default=None),
        status="running",
        started_at=time.time(),
    )
    status, code = "failed", 1
    try:
        status, code = _run_job(cfg, job)
    finally:
        report.update_job(job.run_dir, status=status, exit_code=code, wall_s=time.monotonic() - start)
    return code


def hydra_task(cfg: DictConfig) -> float | None:
    """The body of ``launch.py``'s ``@hydra.main``. A single run exits with the job's status; in a
    multirun a failed job (even one that raised) is recorded and the sweep goes on. Returns the
    final loss, the objective of sweepers such as Optuna; None for a failed job, which Optuna
    records as a failed trial (a NaN would make optuna 2.10 raise in ``study.tell``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    job = Job.from_hydra(hydra_cfg, os.getcwd())
    if hydra_cfg.mode == RunMode.RUN:
        code = run_job(cfg, job)
        if code != 0:
            sys.exit(code)
        return report.final_loss(job.run_dir)
    try:
        code = run_job(cfg, job)
    except Exception:
        traceback.print_exc()  # a bug, shown in full; recorded as failed and the sweep goes on
        code = 1
    return report.final_loss(job.run_dir) if code == 0 else None
