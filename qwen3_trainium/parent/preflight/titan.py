"""torchtitan's own validation of the translated config, as each rank would run it (the full
tier's last check, through ``shape.py``), and its messages relayed in this project's key names."""

from __future__ import annotations

import dataclasses
import logging
import re
from enum import Enum

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight.problem import Problem

# torchtitan's Trainer.Config sections and fields whose names differ from the keys typed here
TITAN_SECTIONS = {"parallelism": "parallel", "metrics": "tracking", "dataloader": "data"}
TITAN_FIELDS = {"tracking.enable_tensorboard": "tracking.tensorboard"}


def ours(text: str) -> str:
    """A torchtitan message with its key names (``parallelism.X``, ``--training.Y``) as typed here."""

    def key(match: re.Match) -> str:
        section, name = match.group(1), match.group(2)
        mapped = f"{TITAN_SECTIONS.get(section, section)}.{name}"
        return TITAN_FIELDS.get(mapped, mapped)

    sections = "|".join(sorted({*TITAN_SECTIONS, *(f.name for f in dataclasses.fields(RunConf))}))
    return re.sub(rf"(?:--)?\b({sections})\.(\w+)", key, text)


def relayed(run: RunConf, error: str) -> Problem:
    """A torchtitan validation error as a problem: its message in this project's key names, keyed
    by the first of them that is a key here (with its value), else by ``(torchtitan)``."""
    message = ours(error)
    for match in re.finditer(r"\b([a-z_]+)\.([a-z_]+)\b", message):
        section = getattr(run, match.group(1), None)
        if dataclasses.is_dataclass(section) and hasattr(section, match.group(2)):
            value = getattr(section, match.group(2))
            value = value.value if isinstance(value, Enum) else value
            return Problem(match.group(0), value, f"torchtitan rejected the config: {message}",
                           f"{match.group(0)}=<a value it accepts> (see the message)")  # fmt: skip
    return Problem("(torchtitan)", "Trainer.Config", f"torchtitan rejected the config: {message}",
                   "change the value it names")  # fmt: skip


def context_parallel_seams(run: RunConf) -> list[Problem]:
    """The seams our SDPA's context parallel relies on (``config/seams.py``, ``context_parallel``),
    each missing one named; probed where the swap is tried, whatever else probed the run's seams."""
    from qwen3_trainium.config import seams
    from qwen3_trainium.parent.preflight.stack import TITAN_FIX, installed

    cp_seams = [seam for seam in seams.SEAMS if "context_parallel" in seam.needed_by]
    return [
        Problem(
            "versions.torchtitan",
            installed("torchtitan"),
            f"torchtitan seam {seam.name} is missing ({error}); used by {seam.uses}",
            f"{TITAN_FIX}; or parallel.context_parallel_degree=1",
        )
        for seam, error in seams.missing(cp_seams)
    ]


def check_titan(run: RunConf, run_dir: str):
    """Let torchtitan validate here, as each rank would: build the Trainer.Config, size the
    model against it (seq_len vs RoPE table, TP vs heads) and apply the overrides, on a copy.
    Returns ``(problems, trial)``: ``trial`` is that validated copy (None on a problem)."""
    import copy

    from torchtitan.config import apply_overrides

    from qwen3_trainium.rank.titan import to_trainer_config

    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # rank 0 logs torchtitan's INFO and warnings; once is enough
    try:
        trial = copy.deepcopy(to_trainer_config(run, run_dir))
        if hasattr(trial.model_spec.model, "layers"):  # native: degrees before torchtitan's own check
            from qwen3_trainium.memory import estimate
            from qwen3_trainium.parent.preflight.system import check_degrees

            degree_problems, _ = check_degrees(run, estimate.model_shape(trial.model_spec.model))
            if degree_problems:
                return degree_problems, None
        # as the rank's trainer does before torchtitan's (rank/context_parallel.py): CP with our SDPA
        from qwen3_trainium.rank.context_parallel import use_context_parallel_attention

        if use_context_parallel_attention(trial) is not None and (missing := context_parallel_seams(run)):
            return missing, None
        trial.model_spec.model.update_from_config(config=trial)
        try:
            apply_overrides(trial.override, trial)
        except (ValueError, TypeError, ImportError) as err:  # conflicts name both overrides
            fix = "drop one of them (override.imports, model.kernels) or narrow its fqns"
            return [
                Problem("override.imports", [str(e) for e in trial.override.imports], str(err), fix)
            ], None
    except (ValueError, TypeError, AssertionError, ImportError, NotImplementedError) as err:
        return [relayed(run, str(err))], None
    finally:
        root.setLevel(level)
    return [], trial
