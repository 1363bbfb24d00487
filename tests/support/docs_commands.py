"""The ``python launch.py`` commands written in README.md and docs/*.md, as a user would copy
them: from fenced code blocks (lines joined over a trailing ``\\``), indented code lines and inline
code spans, each with the markers its trailing comment starts with (``# [trn2]``)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PREFIX = "python launch.py"
MARKER = re.compile(r"#\s*\[([\w-]+)\]")


@dataclass(frozen=True)
class Command:
    where: str  # page:line
    text: str  # the command as written, comment and continuations removed
    markers: frozenset[str]

    @property
    def args(self) -> list[str]:
        return shlex.split(self.text)[2:]


def _command(page: Path, number: int, text: str) -> Command:
    code, _, comment = text.partition(" #")
    markers = frozenset(MARKER.findall("#" + comment)) if comment else frozenset()
    where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    return Command(f"{where}:{number}", " ".join(code.split()), markers)


def page_commands(page: Path) -> list[Command]:
    """The commands of one page, in order, each with its page:line (the line it ends on)."""
    found, fenced, pending = [], False, ""
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        indented = line.startswith("    ") and (pending or line.strip().startswith(PREFIX))
        if fenced or indented:
            pending += line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            if pending.startswith(PREFIX):
                found.append(_command(page, number, pending))
            pending = ""
        else:
            found += [_command(page, number, span) for span in re.findall(rf"`({PREFIX}[^`]*)`", line)]
    return found


def commands() -> list[Command]:
    """Every command of README.md and docs/*.md."""
    return [command for page in PAGES for command in page_commands(page)]


def split_args(args: list[str]) -> tuple[list[str], list[list[str]], bool]:
    """A command's arguments as (Hydra's own overrides, the config overrides each as the list of
    its sweep values (an interval: its lower end), whether it has -m)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import IntervalSweep

    parser = OverridesParser.create()
    hydra_args, config = [], []
    for arg in args:
        if arg == "-m":
            continue
        if arg.startswith(("hydra/", "hydra.")):
            hydra_args.append(arg)
            continue
        override = parser.parse_override(arg)
        if not override.is_sweep_override():
            config.append([arg])
            continue
        sweep = override.value()
        key = override.get_key_element()
        if isinstance(sweep, IntervalSweep):
            config.append([f"{key}={sweep.start}"])
        else:
            config.append([f"{key}={value}" for value in override.sweep_string_iterator()])
    return hydra_args, config, "-m" in args
