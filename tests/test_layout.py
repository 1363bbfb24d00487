"""The package map holds (the contracts themselves run in ``make lint``: ``lint-imports``): no
import cycle between modules, no module over 300 lines, every package says what runs there."""

from __future__ import annotations

import ast

import grimp
import pytest
from conftest import ROOT

PACKAGE = ROOT / "qwen3_trainium"
MAX_LINES = 300
PACKAGES = ("shared", "config", "models", "data", "rank", "memory", "parent")


def _cycles(graph, modules) -> list[list[str]]:
    """Every module that reaches itself again through direct imports (one cycle shown per module)."""
    found = []
    for module in sorted(modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported in modules:
                chain = graph.find_shortest_chain(importer=imported, imported=module)
                if chain:
                    found.append([module, *chain])
                    break
    return found


def test_no_import_cycles():
    graph = grimp.build_graph("qwen3_trainium", "hydra_plugins")
    modules = {m for m in graph.modules if m.startswith(("qwen3_trainium", "hydra_plugins"))}
    assert _cycles(graph, modules) == []


def test_the_cycle_finder_finds_one(tmp_path, monkeypatch):
    """It can fail: two modules importing each other are reported."""
    pkg = tmp_path / "cyclic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic import b\n")
    (pkg / "b.py").write_text("from cyclic import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclic", cache_dir=None)
    assert _cycles(graph, set(graph.modules)) == [
        ["cyclic.a", "cyclic.b", "cyclic.a"],
        ["cyclic.b", "cyclic.a", "cyclic.b"],
    ]


def test_no_module_over_300_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


@pytest.mark.parametrize("name", PACKAGES)
def test_each_package_says_what_runs_there(name):
    doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
    assert doc and len(doc.split()) >= 12, (
        f"qwen3_trainium/{name}/__init__.py needs a docstring saying what runs there"
    )
