"""Every `python launch.py ...` line of the README that targets Trainium passes pre-flight as a dry
run, from a directory laid out as the README assumes (./assets/hf/Qwen3-4B-Instruct-2507 as the
Hub publishes it)."""

from __future__ import annotations

import shlex

import pytest
from conftest import ROOT

from qwen3_trainium import runconfig
from tests.support import hub_layout
from tests.support.published_configs import PUBLISHED

TRAINIUM = ("device=neuron", "parallel=trn2", "cluster=slurm_trn2")


def trainium_lines() -> list[str]:
    lines = [line.split("#")[0].strip() for line in (ROOT / "README.md").read_text().splitlines()]
    return [
        line for line in lines if line.startswith("python launch.py") and any(t in line for t in TRAINIUM)
    ]


def overrides(line: str) -> list[str]:
    """The config overrides of a command line: Hydra's own flags and keys (-m, hydra/..., hydra.*)
    dropped, a sweep's first value taken, dry_run added by the fixture."""
    kept = []
    for arg in shlex.split(line)[2:]:
        if arg == "-m" or arg.startswith(("hydra/", "hydra.", "dry_run=")):
            continue
        key, _, value = arg.partition("=")
        kept.append(f"{key}={value.split(',')[0] if not value.startswith('[') else value}")
    return kept


@pytest.fixture(scope="module")
def launch_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    hub_layout.write_hub_model(
        root / "assets/hf/Qwen3-4B-Instruct-2507",
        PUBLISHED["Qwen/Qwen3-4B-Instruct-2507"][3],
        shards=3,
        tokenizer_dir=runconfig.ASSETS_DIR / "tokenizer",
    )
    return root


def test_the_readme_has_the_trainium_commands():
    lines = trainium_lines()
    assert len(lines) >= 10, lines
    assert any("model=nki_moe" in line and "30B-A3B" in line for line in lines)
    assert any("parallel=trn2_tp4_fsdp16" in line for line in lines)


@pytest.mark.parametrize("line", trainium_lines())
def test_every_trainium_command_in_the_readme_passes_preflight_as_a_dry_run(
    line, launch_dir, dry_run, tmp_path
):
    result, out, err = dry_run(launch_dir, tmp_path, *overrides(line))
    assert result == ("dry_run", 0), err
    assert "# torchrun command" in out and "Traceback" not in err
