"""The docs' `python launch.py ...` lines that target Trainium, traced: each one's step fits a
rank, and the estimate agrees with the trace where it decides. (Every docs line's dry run is
tests/test_docs_commands.py.) From a directory laid out as the docs assume (./assets/hf/... as
the Hub publishes them)."""

from __future__ import annotations

import shlex

import pytest
from conftest import compose_cfg

from qwen3_trainium.parent import compose
from tests.support.docs_commands import commands, split_args
from tests.support.docs_user_dir import use_hub_cache, write_user_dir

TRAINIUM = ("device=neuron", "parallel=trn2", "cluster=slurm_trn2", "experiment=qwen3_30b_a3b_trn2")
HEADLINE = ("experiment=qwen3_30b_a3b_trn2", "model.flavor=30B-A3B")  # Qwen3-30B-A3B, either MoE route
RANK_GIB = 23.812  # a trn2 rank's HBM at LNC=2 (devices.py)


def trainium_lines() -> list[str]:
    """The docs' commands (README.md and docs/, as tests/support/docs_commands.py reads them) that
    target Trainium."""
    return [c.text for c in commands() if any(t in c.text for t in TRAINIUM)]


def overrides(line: str) -> list[str]:
    """The config overrides of a command line: Hydra's own (-m, hydra/..., hydra.*) dropped, a
    sweep's first value taken, dry_run added by the fixture."""
    _, config, _ = split_args(shlex.split(line)[2:])
    return [values[0] for values in config if not values[0].startswith("dry_run=")]


@pytest.fixture(scope="module")
def launch_dir(tmp_path_factory):
    return write_user_dir(tmp_path_factory.mktemp("user"))


@pytest.fixture(autouse=True)
def hub_cache(launch_dir, monkeypatch):
    use_hub_cache(launch_dir, monkeypatch)


def test_the_docs_have_the_trainium_commands():
    lines = trainium_lines()
    assert len(lines) >= 10, lines
    assert any("model=nki_moe" in line and "30B-A3B" in line for line in lines)
    assert any("experiment=qwen3_30b_a3b_trn2" in line for line in lines)
    assert any("parallel=trn2_tp4_fsdp16" in line for line in lines)


# overrides that do not change the traced step: the sizing mode, the step count (a trace is one
# step), and the default model path written out
SAME_JOB = ("memory=", "training.steps=", "model=native")


def traced_lines() -> list[str]:
    """The trn2 lines but the Slurm examples and parallel=auto's, one per set of overrides (the same job written on
    two pages, or with its memory=, dry_run= or training.steps= flags, is traced once)."""
    kept: dict[frozenset, str] = {}
    for line in trainium_lines():
        key = frozenset(o for o in overrides(line) if not o.startswith(SAME_JOB))
        if (
            "cluster=" not in line and "parallel=auto" not in line
        ):  # a plan traces several (test_auto_plan.py)
            kept.setdefault(key, line)
    return list(kept.values())


@pytest.mark.heavy  # a trace each: 20 s to a minute (Qwen3-235B-A22B at 256 ranks: 4 minutes)
@pytest.mark.parametrize("line", traced_lines())
def test_each_trainium_line_traces_and_the_estimate_agrees_where_it_decides(
    line, launch_dir, dry_run, tmp_path
):
    """Each README line that runs on a trn2 (but the Slurm examples), dry-run with memory=trace:
    accepted, and the headline
    job (Qwen3-30B-A3B, either MoE route and layout) at most 90% of a rank's HBM. Where memory=auto resolves to
    the estimate, memory=estimate is within 15% of the traced step peak."""
    import re

    from qwen3_trainium.config.schema import MemoryMode

    result, out, err = dry_run(launch_dir, tmp_path / "trace", *overrides(line), "memory=trace")
    assert result == ("dry_run", 0), err
    peak = float(re.search(r"step peak\s+([\d.]+) GiB", out).group(1))
    if any(h in line for h in HEADLINE):
        assert peak <= 0.9 * RANK_GIB, f"{line}: traced {peak:.2f} GiB"
    run = compose.resolve(compose_cfg(*overrides(line)), str(launch_dir))
    if run.memory.mode is not MemoryMode.estimate:
        print(f"{line}\n  traced step peak {peak:.3f} GiB (memory=auto traces this one)")
        return
    result, out, err = dry_run(launch_dir, tmp_path / "estimate", *overrides(line), "memory=estimate")
    estimate = float(re.search(r"total per rank\s+([\d.]+) GiB", out).group(1))
    print(f"{line}\n  traced step peak {peak:.3f} GiB, estimate {estimate:.3f} GiB ({estimate / peak:.3f})")
    assert abs(estimate / peak - 1) <= 0.15
