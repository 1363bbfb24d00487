"""``python launch.py --help`` (Hydra's app help, ``hydra.help`` in conf/config.yaml): every config
group with every option shipped in conf/, the options in force, and the docs pages by name."""

from __future__ import annotations

import re

from conftest import CONF, ROOT, run_launch, shipped_options


def _help(*args: str) -> str:
    proc = run_launch(*args, "--help", timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def test_help_lists_every_group_with_every_option_and_points_to_each_docs_page():
    out = _help()
    groups: dict[str, list[str]] = {}
    for group, option in shipped_options():
        groups.setdefault(group, []).append(option)
    for group, options in groups.items():
        line = re.search(rf"^{group}: (.*)$", out, re.M)
        assert line, f"--help does not list the group {group}"
        assert sorted(line.group(1).split(", ")) == sorted(options), line.group(0)
    pages = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    assert len(pages) >= 10 and "docs/" in out
    footer = out[out.index("Docs:") :]
    missing = [page for page in pages if not re.search(rf"\b{page}\b", footer)]
    assert not missing, f"--help does not name these docs pages: {missing}"
    assert (CONF / "config.yaml").exists() and "python launch.py" in out


def test_help_shows_the_options_in_force_with_the_overrides_applied():
    out = _help("model=nki_moe", "peft=lora")
    line = re.search(r"^in force: (.*)$", out, re.M).group(1).split()
    assert "model=nki_moe" in line and "peft=lora" in line and "device=auto" in line
    assert not any(choice.startswith("hydra/") for choice in line)
