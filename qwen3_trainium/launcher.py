"""From a composed Hydra config to a running torchrun: argv and env (pure) + launch (impure).

One launch form for every path and device, the guide's:
``torchrun --nproc_per_node=N --rdzv_backend c10d --rdzv_endpoint localhost:0 ...``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from omegaconf import DictConfig

from qwen3_trainium import devices, preflight, runconfig, titan, tracking
from qwen3_trainium.schema import RunConf
from qwen3_trainium.titan import CONFIG_FUNCTION, CONFIG_MODULE, RUN_DIR_ENV

RANK_ENTRY = "qwen3_trainium.train"


def torchrun_executable() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return beside if os.path.exists(beside) else "torchrun"


def torchrun_argv(run: RunConf, run_dir: str) -> list[str]:
    launcher = run.launcher
    return [
        torchrun_executable(),
        f"--nnodes={launcher.nnodes}",
        f"--nproc_per_node={launcher.nproc_per_node}",
        "--rdzv_backend",
        launcher.rdzv_backend,
        "--rdzv_endpoint",
        launcher.rdzv_endpoint,
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
    env = {RUN_DIR_ENV: run_dir, "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.update(
        devices.rank_env(
            run.device.type.value,
            nproc_per_node=run.launcher.nproc_per_node,
            lnc=run.device.lnc,
            compile_cache=run.device.compile_cache,
        )
    )
    env.update(tracking.wandb_env(run, environ))
    return env


def describe(run: RunConf, argv: list[str], env: dict[str, str]) -> str:
    lines = ["# resolved config", runconfig.to_yaml(run).rstrip(), ""]
    lines += ["# override.imports (applied by torchtitan in each rank, in this order)"]
    lines += [f"- {entry}" for entry in titan.override_imports(run)] or ["(none)"]
    lines += ["", "# torchrun command"]
    lines.append(shlex.join(argv))
    lines += ["", "# environment (added to the current one)"]
    lines += [f"{key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    return "\n".join(lines)


def launch(argv: list[str], env: dict[str, str]) -> int:
    """Run torchrun with rank 0's output streamed; return its exit status."""
    completed = subprocess.run(argv, env={**os.environ, **env}, check=False)
    return completed.returncode


def run_job(cfg: DictConfig, *, run_dir: str, run_name: str, launch_dir: str) -> int:
    """Resolve, check, describe or launch one job; return its exit status."""
    missing = preflight.missing_values(cfg)
    if missing:
        print(preflight.format_problems(missing), file=sys.stderr)
        return 2
    run = runconfig.resolve(cfg, launch_dir)
    run.run_name = run.run_name or run_name
    if run.doctor:
        from qwen3_trainium import doctor

        healthy, text = doctor.report(run, launch_dir, tty=sys.stdout.isatty())
        print(text)
        return 0 if healthy else 1
    notes: list[str] = []
    problems = preflight.check(run, run_dir, launching=not run.dry_run, notes=notes)
    if problems:
        print(preflight.format_problems(problems), file=sys.stderr)
        return 2
    for note in notes:
        print(f"[qwen3-trainium] {note}", flush=True)
    argv, env = torchrun_argv(run, run_dir), rank_env(run, run_dir, dict(os.environ))
    if run.dry_run:
        print(describe(run, argv, env))
        return 0
    runconfig.save(run, run_dir)
    print(f"[qwen3-trainium] run directory: {run_dir}", flush=True)
    print(f"[qwen3-trainium] {shlex.join(argv)}", flush=True)
    code = launch(argv, env)
    if code == 0 and run.checkpoint.enable and run.checkpoint.last_save_in_hf and run.checkpoint.export_check:
        from qwen3_trainium import export_check

        passed, line = export_check.verify(run, run_dir)
        print(f"[qwen3-trainium] {line}", flush=True)
        code = 0 if passed else 3
    return code
