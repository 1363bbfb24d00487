"""The torchrun command line and the ranks' environment for a run config (pure: values in,
values out). One launch form for every path and device, the guide's:
``torchrun --nproc_per_node=N --rdzv_backend c10d --rdzv_endpoint localhost:0 ...``.
"""

from __future__ import annotations

import os
import shlex
import sys

from qwen3_trainium.config import devices, nodes, runconfig
from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent import compose, export_facts, tracking
from qwen3_trainium.rank import titan
from qwen3_trainium.shared.contract import CONFIG_FUNCTION, CONFIG_MODULE, RANK_ENTRY, RUN_DIR_ENV


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
    env.update(export_facts.neuron_cc_flags(run, environ))
    env.update(nodes.node_env(run.launcher, run.device.type.value))
    env.update(tracking.wandb_env(run, environ))
    return env


def describe(run: RunConf, argv: list[str], env: dict[str, str]) -> str:
    lines = ["# resolved config", compose.to_yaml(run).rstrip(), ""]
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
