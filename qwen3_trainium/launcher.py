"""From a composed Hydra config to a running torchrun: argv and env (pure) + launch (impure).

One launch form for every path and device, the guide's:
``torchrun --nproc_per_node=N --rdzv_backend c10d --rdzv_endpoint localhost:0 ...``.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from qwen3_trainium import devices, gate, lifeline, nodes, preflight, report, runconfig, stop, titan, tracking
from qwen3_trainium.preflight import cache
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
        return Started(_popen(argv, full_env))
    log_path = os.path.join(run_dir, TORCHRUN_LOG)
    print(f"[qwen3-trainium] rank 0's output: {log_path} (every rank: {run_dir}/logs)", flush=True)
    log = open(log_path, "w")
    return Started(_popen(argv, full_env, stdout=log, stderr=subprocess.STDOUT), log_path, log)


def _popen(argv: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
    """torchrun dies with the launcher, and its ranks with it (``lifeline.py``). While stop signals
    are handled (``stop.LauncherSignals``, see ``run_job``), torchrun runs in a session of its own
    with SIGTERM ignored, and the launcher passes signals on (``stop.py``)."""
    env = {**env, lifeline.PARENT_ENV: str(os.getpid())}
    tie = lifeline.preexec(os.getpid())
    signals = stop.LauncherSignals.current
    if signals is None:
        return subprocess.Popen(argv, env=env, preexec_fn=tie, **kwargs)
    env = {**env, **stop.torchrun_env(env)}

    def setup() -> None:
        tie()
        stop.ignore_sigterm()

    with signals.starting(env.get(stop.REQUEST_ENV)):
        process = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=setup, **kwargs)
        signals.attach(process)
    return process


def _wait(process: subprocess.Popen) -> int:
    signals = stop.LauncherSignals.current
    while True:
        try:
            code = process.wait(timeout=None if signals is None else stop.POLL_S)
        except subprocess.TimeoutExpired:
            signals.tick()  # after a fast stop: torchrun once its ranks left, or all at the grace's end
            continue
        if signals is not None:
            signals.reap()  # after a fast stop: any rank still unwinding
        return code


def finish(started: Started, *, run_dir: str, total_steps: int) -> int:
    """Wait for torchrun; return its exit status. In progress mode one live line shows steps,
    loss, tokens/s and ETA meanwhile, and the log's tail is printed if the run fails."""
    if started.log is None:
        return _wait(started.process)
    from qwen3_trainium.progress import ProgressLine

    with started.log, ProgressLine(run_dir, total_steps, sys.stdout):
        code = _wait(started.process)
    if code != 0:
        print(f"[qwen3-trainium] torchrun exited {code}; the end of {started.log_path}:", file=sys.stderr)
        print(_tail(started.log_path), file=sys.stderr, end="", flush=True)
    return code


class Preflight:
    """Every pre-flight check of one job, run once: a remembered pass (``preflight/cache.py``)
    is reused, a fresh pass is remembered."""

    def __init__(self, run: RunConf, run_dir: str, *, launching: bool) -> None:
        self.run, self.run_dir, self.launching = run, run_dir, launching
        self.versions = preflight.installed_versions(run)  # for the cache key and job.json
        self.digest = None
        if run.preflight_cache:
            self.digest = cache.key(run, run_dir, launching=launching, versions=self.versions)
        remembered = cache.load(self.digest) if self.digest else None
        self.notes, self.facts = remembered if remembered else (None, {})
        self.cached = remembered is not None
        self.disk_notes: list[str] = []

    def problems(self) -> list:
        """Every problem; the free disk against the checkpoints is checked every time."""
        if not self.cached:
            self.notes, self.facts = [], {}
            problems = preflight.check(
                self.run, self.run_dir, launching=self.launching, notes=self.notes, facts=self.facts
            )
            if problems:
                return problems
            if self.digest:
                cache.store(self.digest, self.notes, self.facts)
        if not self.launching:
            return []
        return preflight.check_disk(self.run, self.run_dir, self.facts.get("params", 0), self.disk_notes)

    def print_notes(self) -> None:
        for note in (self.notes or []) + self.disk_notes:
            print(f"[qwen3-trainium] {note}", flush=True)
        if self.cached:
            print(
                "[qwen3-trainium] pre-flight: passed before with this config, code, versions and inputs (cached; preflight_cache=false checks again)",
                flush=True,
            )


def _refuse(problems: list, *, ranks_started: bool = False) -> tuple[str, int]:
    print(preflight.format_problems(problems, ranks_started=ranks_started), file=sys.stderr)
    return "failed", 2


def _run_job(cfg: DictConfig, job: Job) -> tuple[str, int]:
    """(status, exit code) of resolving, checking, describing or launching one job.

    Nothing starts before every check passed, except in one case: the checks that need no torch
    passed and the rest must run (not remembered). Then torchrun starts at once and the rest runs
    here while the ranks import torch; they wait for the verdict before touching a device
    (``gate.py``), and a refusal ends the job with the same message and exit code 2."""
    unset = preflight.unknown_keys(cfg) + preflight.missing_values(cfg)
    if unset:
        return _refuse(unset)
    run = runconfig.resolve(cfg, job.launch_dir)
    run.run_name = run.run_name or job.run_name
    if run.doctor:
        from qwen3_trainium import doctor

        healthy, text = doctor.report(run, job.launch_dir, tty=sys.stdout.isatty())
        print(text)
        return ("ok", 0) if healthy else ("failed", 1)
    machine = preflight.check_machine(
        run, job.run_dir, launching=not run.dry_run, layout=job.choices.get("parallel", "")
    )
    if machine:  # with the config's own problems, if any: all of them at once
        return _refuse(machine + preflight.check_static(run, job.run_dir, launching=not run.dry_run))
    checks = Preflight(run, job.run_dir, launching=not run.dry_run)
    overlap = (
        not run.dry_run and not checks.cached and not preflight.check_static(run, job.run_dir, launching=True)
    )
    if not overlap:
        problems = checks.problems()
        if problems:
            return _refuse(problems)
        checks.print_notes()
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
    runconfig.save(run, job.run_dir)
    return _run_to_end(run, job, _start(run, job, argv, env), lead)


def _record_start(run: RunConf, run_dir: str, versions: dict[str, str]) -> None:
    report.update_job(run_dir, run_name=run.run_name, versions=versions, git_commit=tracking.git_commit())


def _start(run: RunConf, job: Job, argv: list[str], env: dict[str, str]) -> Started:
    print(f"[qwen3-trainium] run directory: {job.run_dir}", flush=True)
    print(f"[qwen3-trainium] {shlex.join(argv)}", flush=True)
    progress = use_progress(run.launcher.progress, sys.stdout.isatty())
    # a stop asked of an earlier run of this directory (a resume's) is not this run's
    request = stop.request_path(job.run_dir, run.launcher.node_rank)
    stop.remove(request, *([stop.marker_path(job.run_dir)] if run.launcher.node_rank == 0 else []))
    env = {**env, stop.REQUEST_ENV: request}
    return start(argv, env, run_dir=job.run_dir, progress=progress)


def _run_to_end(run: RunConf, job: Job, started: Started, lead: bool) -> tuple[str, int]:
    """Wait for torchrun; on the lead node the loss plot (drawn while torchrun shuts down)."""
    plotter = report.RunPlotter(job.run_dir, run.run_name, run.training.steps) if lead else None
    code = finish(started, run_dir=job.run_dir, total_steps=run.training.steps)
    return _after_run(run, job, code, plotter)


def _overlapped(run: RunConf, job: Job, checks: Preflight, argv, env, lead: bool) -> tuple[str, int]:
    """torchrun first, pre-flight meanwhile. The ranks read a staged copy of the resolved config,
    so a refused run leaves the run directory's own ``resolved.yaml`` (a resume's) untouched."""
    name = runconfig.resolved_name(run.launcher.node_rank)
    staged = name.replace(".yaml", ".staged.yaml")
    verdict = gate.verdict_path(job.run_dir, run.launcher.node_rank)
    runconfig.save(run, job.run_dir, name=staged)
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
            return _refuse(problems, ranks_started=True)
        if lead:
            _record_start(run, job.run_dir, checks.versions)
        runconfig.save(run, job.run_dir)
        gate.write(verdict, ok=True)
        checks.print_notes()
        return _run_to_end(run, job, started, lead)
    finally:
        for path in (os.path.join(job.run_dir, staged), verdict):
            if os.path.exists(path):
                os.remove(path)


def _after_run(run: RunConf, job: Job, code: int, plotter: report.RunPlotter | None) -> tuple[str, int]:
    """On the lead node: the loss plot (drawn while torchrun shut down), then the export check.
    A stop signal makes the job ``interrupted``, exit code 128 + the signal (``stop.outcome``)."""
    marker = stop.read_json(stop.marker_path(job.run_dir))
    status, code = stop.outcome(code, marker, stop.LauncherSignals.current)
    if status == "interrupted":
        print(f"[qwen3-trainium] {stop.describe(marker, code)}", file=sys.stderr, flush=True)
    if plotter is None:
        return status, code
    plotter.finish()
    if status == "interrupted":
        report.update_job(job.run_dir, stop=marker)
        return status, code
    if code == 0 and run.checkpoint.enable and run.checkpoint.last_save_in_hf and run.checkpoint.export_check:
        from qwen3_trainium import export_check

        passed, line = export_check.verify(run, job.run_dir)
        print(f"[qwen3-trainium] {line}", flush=True)
        code = 0 if passed else 3
    if code == 0 and run.eval.enable:
        from qwen3_trainium import samples

        passed, line = samples.after_run(run, job.run_dir)
        if line:
            print(f"[qwen3-trainium] {line}", flush=True)
        code = 0 if passed else 3
    return ("ok" if code == 0 else "failed"), code


def run_job(cfg: DictConfig, job: Job) -> int:
    """One job, recorded in ``<run_dir>/job.json`` (status, exit code, wall time) for summaries
    by its first node (every node of a multi-node job runs this, one torchrun each).
    A stop signal (``stop.py``) ends the whole command with 128 + the signal, a sweep too."""
    with stop.LauncherSignals():
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
                objective=report.objective_key(_eval_enabled(cfg)),
                status="running",
                started_at=time.time(),
                stop=None,  # a resumed run's earlier stop
            )
        status, code = _run_job(cfg, job)
    except stop.Interrupted as stopped:
        print(f"[qwen3-trainium] {stopped}", file=sys.stderr, flush=True)
        status, code = "interrupted", stop.exit_code(stopped.signum)
    finally:
        if lead:
            wall_s = time.monotonic() - start
            report.update_job(
                job.run_dir, status=status, exit_code=code, wall_s=wall_s, **report.final_metrics(job.run_dir)
            )
    return status, code


def _eval_enabled(cfg: DictConfig) -> bool:
    return bool(OmegaConf.select(cfg, "eval.enable", default=False))


def objective(cfg: DictConfig, run_dir: str) -> float | None:
    """The value a job returns to sweepers: its final held-out loss with eval=on, else its final
    training loss (``job.json`` and the sweep summary's ``objective`` column say which); None
    when the run logged none."""
    value = report.final_loss(run_dir, report.objective_key(_eval_enabled(cfg)))
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
