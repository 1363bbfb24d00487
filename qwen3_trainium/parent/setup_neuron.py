"""``make setup-neuron``: install this project into an existing Neuron environment.

AWS's flow gives a ready venv: the DLAMI's ``/opt/aws_neuronx_venv_torch_neuronx_2_14*`` (PyTorch
2.14, torch-neuronx 2.14.3.1 in SDK 2.34 or 2.14.3.0 in 2.33, neuronx-cc, nki; releases and
sources: ``config/neuron_sdk.py``), often with TorchTitan Neuron installed editable from a clone.
This script adds the project to that venv without touching what the Neuron SDK or the user owns:

- the venv: ``NEURON_VENV`` if set, else the active venv when ``torch_neuronx`` imports there,
  else the DLAMI venv (the newest ``..._2_14*`` there is);
- torch, torch-neuronx, neuronx-cc, nki and torchtitan are never reinstalled or upgraded when
  present (pip gets a constraints file pinning them to what is installed);
- only the missing dependencies are installed (pyproject.toml and requirements-neuron.txt); a
  present one outside this project's range is reported with the command to change it, not changed;
- the project itself goes in editable with ``--no-deps``;
- ``NEURON_PIP_INDEX`` (or ``--index-url``) is passed to pip as an extra index.

Standard library only: it starts under whatever ``python3`` runs ``make`` and re-executes itself
with the chosen venv's interpreter.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # re-executed as a file in a venv the project is not installed in yet
from qwen3_trainium.config import neuron_sdk  # noqa: E402 (standard library only)

DLAMI_VENV = neuron_sdk.DLAMI_VENV  # AWS's documented name (PyTorch 2.14.0)
PROTECTED = ("torch", "torch-neuronx", "neuronx-cc", "nki", "torchtitan")
RECORD = ROOT / ".neuron-venv"  # the chosen venv, for `make test-neuron`
TAG = "[setup-neuron]"
WHY_ENV = "QWEN3_TRAINIUM_VENV_REASON"  # why the venv was chosen, kept across the re-exec


class SetupError(Exception):
    """A problem the user fixes (no venv, a bad NEURON_VENV): printed, exit 2."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imports_torch_neuronx(venv: str) -> bool:
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        return False
    probe = subprocess.run([python, "-c", "import torch_neuronx"], capture_output=True, check=False)
    return probe.returncode == 0  # PyPI's placeholder raises on import


def dlami_venvs(pattern: str = neuron_sdk.DLAMI_VENV_GLOB) -> list[str]:
    """The DLAMI's PyTorch 2.14 venvs, newest first (2_14_1 before 2_14_0): 2.34's name is not
    documented, and it follows PyTorch's version (``config/neuron_sdk.py``)."""
    found = sorted(
        glob.glob(pattern), key=lambda p: [int(n) for n in re.findall(r"\d+", os.path.basename(p))]
    )
    return list(reversed(found)) or [DLAMI_VENV]


def choose_venv(
    environ, probe=imports_torch_neuronx, isdir=os.path.isdir, dlami=dlami_venvs
) -> tuple[str, str]:
    """(venv directory, why it was chosen)."""
    if environ.get("NEURON_VENV"):
        venv = os.path.abspath(os.path.expanduser(environ["NEURON_VENV"]))
        if not os.path.exists(os.path.join(venv, "bin", "python")):
            raise SetupError(
                f"NEURON_VENV={environ['NEURON_VENV']}: no bin/python there. "
                f"Fix: NEURON_VENV=<a Neuron venv, e.g. {DLAMI_VENV}>"
            )
        return venv, "NEURON_VENV"
    active = environ.get("VIRTUAL_ENV")
    if active and probe(active):
        return active, "the active venv (torch_neuronx imports there)"
    for venv in dlami():
        if isdir(venv):
            return venv, "the Neuron DLAMI's venv"
    seen = f"the active venv {active} has no working torch_neuronx" if active else "no venv is active"
    raise SetupError(
        f"no Neuron environment found: {seen}, and no DLAMI venv {neuron_sdk.DLAMI_VENV_GLOB} exists. "
        "Fix: activate the venv that has torch-neuronx (AWS's Neuron DLAMI or container), "
        "or NEURON_VENV=<its directory> make setup-neuron"
    )


def read_requirements(root: Path = ROOT) -> list[str]:
    """The project's dependencies (pyproject.toml) followed by the Neuron packages."""
    text = (root / "pyproject.toml").read_text()
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml has a [project] dependencies list"
    reqs = re.findall(r'"([^"]+)"', block.group(1))
    neuron = (root / "requirements-neuron.txt").read_text().splitlines()
    return reqs + [line.split("#")[0].strip() for line in neuron if line.split("#")[0].strip()]


def _requirement(spec: str):
    try:
        from packaging.requirements import Requirement
    except ImportError:  # every pip vendors it
        from pip._vendor.packaging.requirements import Requirement
    return Requirement(spec)


@dataclass
class Plan:
    install: list[str] = field(default_factory=list)  # missing: pip installs these
    protected: list[str] = field(default_factory=list)  # present and never changed
    satisfied: list[str] = field(default_factory=list)
    outside: list[tuple[str, str, str]] = field(default_factory=list)  # (name, installed, wanted)


def make_plan(requirements: list[str], installed: dict[str, str]) -> Plan:
    plan = Plan()
    for spec in requirements:
        req = _requirement(spec)
        name = canonical(req.name)
        have = installed.get(name)
        if have is None:
            plan.install.append(spec)
        elif name in PROTECTED:
            plan.protected.append(f"{name} {have}")
        elif req.specifier.contains(have, prereleases=True):
            plan.satisfied.append(f"{name} {have}")
        else:
            plan.outside.append((name, have, str(req.specifier)))
    return plan


def installed_here() -> dict[str, str]:
    import importlib.metadata

    return {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}


def pip_commands(plan: Plan, constraints_path: str, index: str) -> list[list[str]]:
    pip = [sys.executable, "-m", "pip", "install"]
    extra = ["--extra-index-url", index] if index else []
    commands = []
    if plan.install:
        commands.append([*pip, "-c", constraints_path, *extra, *plan.install])
    commands.append([*pip, "--no-deps", "-e", str(ROOT)])
    return commands


def protecting_constraints(installed: dict[str, str]) -> str:
    """pip constraints that hold every present protected package at its installed version."""
    return "".join(f"{name}=={installed[name]}\n" for name in PROTECTED if name in installed)


def describe(venv: str, why: str, plan: Plan, commands: list[list[str]]) -> str:
    lines = [f"{TAG} venv: {venv} ({why})"]
    lines.append(
        f"{TAG} kept as installed (never reinstalled or upgraded): {', '.join(plan.protected) or '-'}"
    )
    lines.append(f"{TAG} already satisfied: {len(plan.satisfied)} package(s)")
    lines.append(f"{TAG} installing (missing): {', '.join(plan.install) or 'nothing'}")
    for name, have, wanted in plan.outside:
        lines.append(
            f"{TAG} NOT changed: {name} {have} is outside this project's range {wanted}; pre-flight says "
            f"what needs it. To change it: {sys.executable} -m pip install '{name}{wanted}'"
        )
    lines += [f"{TAG} $ {' '.join(command)}" for command in commands]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the pip commands only")
    parser.add_argument("--index-url", default=os.environ.get("NEURON_PIP_INDEX", ""))
    args = parser.parse_args(argv)
    try:
        venv, why = choose_venv(os.environ)
    except SetupError as err:
        print(f"{TAG} {err}", file=sys.stderr)
        return 2
    if os.path.realpath(sys.prefix) != os.path.realpath(venv):  # go on in the venv's own Python
        python = os.path.join(venv, "bin", "python")
        env = {**os.environ, "NEURON_VENV": venv, WHY_ENV: why}
        os.execve(python, [python, __file__, *(argv if argv is not None else sys.argv[1:])], env)
    why = os.environ.get(WHY_ENV, why)
    installed = installed_here()
    plan = make_plan(read_requirements(), installed)
    fd, protect = tempfile.mkstemp(suffix="-protect.txt")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(protecting_constraints(installed))
        commands = pip_commands(plan, protect, args.index_url)
        print(describe(venv, why, plan, commands), flush=True)
        if args.dry_run:
            return 0
        for command in commands:
            if subprocess.run(command, check=False).returncode != 0:
                print(f"{TAG} failed: {' '.join(command)}", file=sys.stderr)
                return 1
    finally:
        os.unlink(protect)
    RECORD.write_text(venv + "\n")
    print(f"{TAG} done; `make test-neuron` and `make doctor-neuron` use {venv}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
