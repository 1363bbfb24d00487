"""Every ``python launch.py`` command in README.md and docs/*.md, checked: a renamed key, a removed
option or a command that pre-flight refuses fails here.

Commands are taken from fenced code blocks (lines joined over a trailing ``\\``), indented code
lines and inline code spans. Each one, from a directory laid out as the docs assume (HF
directories of the Hub's layout under ./assets/hf, ./my_chats.jsonl, ./my_chats/, ./my_corpus/,
HuggingFaceH4/ultrachat_200k in the local HF cache):
- composes with Hydra, its Hydra overrides (``hydra/...``, ``hydra.*``) included, every value of a
  sweep (``a,b``, ``range(...)``; an interval's lower end) on its own;
- passes pre-flight as an in-process dry run of its first sweep values, on a host with 32 GiB
  (``memory=estimate``; the heavy test of tests/parent/test_readme_trainium.py traces the trn2
  lines);
- carries the marker of the hardware it needs to train, at the start of its trailing comment
  (``# [trn2]``, ``# [cuda]``, ``# [slurm]``), exactly when it needs one: a dry-run line needs none.
  A line shown to be refused is marked ``# [refused]``, and pre-flight must refuse it (exit 2).
"""

from __future__ import annotations

import re

import pytest
from conftest import CONF, compose_cfg
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from qwen3_trainium.parent import compose as run_compose
from tests.support.docs_commands import PAGES, Command, commands, page_commands, split_args
from tests.support.docs_user_dir import use_hub_cache, write_user_dir


def _checked() -> list[Command]:
    """One of each distinct command and markers (the first place it is written: the same command
    marked otherwise elsewhere is checked again), ``--help`` left to tests/parent/test_help.py."""
    seen: dict[tuple[str, frozenset], Command] = {}
    for command in commands():
        if "--help" not in command.args:
            seen.setdefault((command.text, command.markers), command)
    return list(seen.values())


def _compose_with_hydra(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def _needs(run, composed) -> set[str]:
    """What the command needs to train: a trn2 (device=neuron), CUDA, a Slurm cluster (the
    submitit launcher, which cluster=slurm_* selects)."""
    needs = {"neuron": {"trn2"}, "cuda": {"cuda"}}.get(run.device.type.value, set())
    slurm = "slurm" in composed.hydra.launcher._target_.lower()
    return {"slurm"} if slurm else needs  # a Slurm cluster's nodes are its devices: one marker


@pytest.fixture(scope="module")
def docs_dir(tmp_path_factory):
    return write_user_dir(tmp_path_factory.mktemp("user"))


@pytest.fixture
def workstation(monkeypatch):
    """A host with 32 GiB available: CPU lines are checked against a stated machine, not against
    whatever else this one is running (a full fine-tune of Qwen3-0.6B on CPU estimates 20 GiB)."""
    from qwen3_trainium.config import devices

    monkeypatch.setattr(devices, "available_memory", lambda: 32 * 1024**3)


@pytest.fixture
def hub_cache(docs_dir, monkeypatch):
    use_hub_cache(docs_dir, monkeypatch)


def test_the_docs_have_commands_and_every_page_starts_with_one():
    found = commands()
    assert len(found) >= 40, [c.where for c in found]
    for page in PAGES[1:]:
        text = page.read_text()
        first_block = text.find("```")
        assert text.startswith("# ") and 0 < first_block < 1200, f"{page.name}: no command near its top"


def test_a_command_is_read_whole_with_its_marker_and_continuations(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Run `python launch.py smoke=on` first.\n\n```\n"
        "python launch.py model=nki_moe \\\n  'checkpoint=[hf_finetune,hf_export]'   # [trn2] after it\n"
        "make test\n```\n\n    python launch.py memory=trace dry_run=true\n"
    )
    found = [(c.text, c.markers) for c in page_commands(page)]
    assert found == [
        ("python launch.py smoke=on", frozenset()),
        ("python launch.py model=nki_moe 'checkpoint=[hf_finetune,hf_export]'", frozenset({"trn2"})),
        ("python launch.py memory=trace dry_run=true", frozenset()),
    ]


@pytest.mark.parametrize("command", _checked(), ids=lambda c: c.where)
def test_each_docs_command_composes_passes_preflight_and_is_marked(
    command, docs_dir, hub_cache, workstation, dry_run, tmp_path
):
    assert not re.search(r"<[^>]*>", command.text), (
        f"{command.where}: a placeholder in a command: {command.text}"
    )
    hydra_args, config, multirun = split_args(command.args)
    assert multirun or all(len(values) == 1 for values in config), f"{command.where}: a sweep needs -m"
    first = [values[0] for values in config]
    for i, values in enumerate(config):
        for value in values[1:]:  # each further sweep value composes in place of the first
            compose_cfg(*first[:i], value, *first[i + 1 :])
    composed = _compose_with_hydra(hydra_args + first)
    run = run_compose.resolve(compose_cfg(*first), str(docs_dir))
    needs = set() if "dry_run=true" in first else _needs(run, composed)
    assert set(command.markers - {"refused"}) == needs, (
        f"{command.where}: marked {sorted(command.markers)}, but it needs {sorted(needs)} to run "
        "(a line that trains on a trn2, CUDA or Slurm starts its comment with # [trn2], # [cuda], # [slurm]; "
        f"a dry run needs none): {command.text}"
    )
    if "doctor=true" in first:
        return  # the doctor reports on this host; tests/parent/test_doctor*.py run it
    kept = [arg for arg in first if not arg.startswith(("memory=", "dry_run="))]
    result, out, err = dry_run(docs_dir, tmp_path, *kept, "memory=estimate")
    expected = ("failed", 2) if "refused" in command.markers else ("dry_run", 0)
    assert result == expected, f"{command.where}: {command.text}\n{err[-3000:]}"
    assert "Traceback" not in err


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but - and _ dropped, spaces
    to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_docs_reaches_a_page_and_a_heading():
    broken = []
    for page in PAGES:
        prose = re.sub(r"```.*?```|`[^`\n]*`", "", page.read_text(), flags=re.S)  # code is not links
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken
