"""Every `python launch.py ...` line of the README that targets Trainium passes pre-flight as a dry
run, from a directory laid out as the README assumes (./assets/hf/Qwen3-4B-Instruct-2507 as the
Hub publishes it)."""

from __future__ import annotations

import shlex

import pytest
from conftest import ROOT, compose_cfg

from qwen3_trainium.config import runconfig
from qwen3_trainium.parent import compose
from tests.support import hub_layout
from tests.support.published_configs import PUBLISHED

TRAINIUM = ("device=neuron", "parallel=trn2", "cluster=slurm_trn2", "experiment=qwen3_30b_a3b_trn2")
HEADLINE = ("experiment=qwen3_30b_a3b_trn2", "model.flavor=30B-A3B")  # Qwen3-30B-A3B, model=nki_moe
RANK_GIB = 23.812  # a trn2 rank's HBM at LNC=2 (devices.py)


def trainium_lines() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    lines = [line.split("#")[0].strip() for page in pages for line in page.read_text().splitlines()]
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
    for name, shards in (("Qwen3-4B-Instruct-2507", 3), ("Qwen3-30B-A3B", 16)):
        hub_layout.write_hub_model(
            root / f"assets/hf/{name}",
            PUBLISHED[f"Qwen/{name}"][3],
            shards=shards,
            tokenizer_dir=runconfig.ASSETS_DIR / "tokenizer",
        )
    return root


def test_the_readme_has_the_trainium_commands():
    lines = trainium_lines()
    assert len(lines) >= 10, lines
    assert any("model=nki_moe" in line and "30B-A3B" in line for line in lines)
    assert any("experiment=qwen3_30b_a3b_trn2" in line for line in lines)
    assert any("parallel=trn2_tp4_fsdp16" in line for line in lines)


@pytest.mark.parametrize(
    "line",
    # a memory=trace line is a trace of minutes (Qwen3-235B-A22B at 256 ranks: about 2): the heavy
    # test below dry-runs every line with memory=trace, so it runs there, not twice
    [line for line in trainium_lines() if "memory=trace" not in line],
)
def test_every_trainium_command_in_the_readme_passes_preflight_as_a_dry_run(
    line, launch_dir, dry_run, tmp_path
):
    result, out, err = dry_run(launch_dir, tmp_path, *overrides(line))
    assert result == ("dry_run", 0), err
    assert "# torchrun command" in out and "Traceback" not in err


@pytest.mark.heavy  # a trace each: 20 s to a minute (Qwen3-235B-A22B at 256 ranks: 3 minutes)
@pytest.mark.parametrize("line", [line for line in trainium_lines() if "cluster=" not in line])
def test_each_trainium_line_traces_and_the_estimate_agrees_where_it_decides(
    line, launch_dir, dry_run, tmp_path
):
    """Each README line that runs on a trn2 (but the Slurm examples), dry-run with memory=trace:
    accepted, and the headline
    job (Qwen3-30B-A3B, model=nki_moe) at most 90% of a rank's HBM. Where memory=auto resolves to
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
