"""The import contracts in pyproject.toml hold, bite when broken, and the package has no import
cycle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_contracts_kept():
    r = _lint_imports(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        # a check must not reach into the controller (it runs on every node)
        ("checks/host.py", "babysitter.controller.policy"),
        # checks/all.py is the composition root: a check importing it would bring back
        # registration by import (and a cycle waiting to happen)
        ("checks/gpu.py", "babysitter.checks.all"),
    ],
)
def test_contract_bites_when_a_check_imports_what_it_must_not(
    tmp_path: Path, module: str, forbidden: str
):
    shutil.copytree(REPO / "babysitter", tmp_path / "babysitter")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    src = tmp_path / "babysitter" / module
    src.write_text(src.read_text() + f"\nimport {forbidden}  # noqa\n")
    r = _lint_imports(tmp_path)
    assert r.returncode != 0
    importer = "babysitter." + module.removesuffix(".py").replace("/", ".")
    assert "BROKEN" in r.stdout and importer in r.stdout, r.stdout


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycle():
    assert _cycles(grimp.build_graph("babysitter")) == []


def test_cycle_finder_finds_a_cycle(tmp_path: Path):
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc import b\n")
    (pkg / "b.py").write_text("from cyc import a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert _cycles(grimp.build_graph("cyc")) == [["cyc.a", "cyc.b"]]
    finally:
        sys.path.remove(str(tmp_path))


def test_every_command_module_is_reachable_through_the_lazy_table():
    """The CLI imports a command's module only when that command is run: a command missing
    from COMMANDS would be 'No such command' (as `validate` once was inside Slurm jobs)."""
    import importlib

    from babysitter.cli.main import COMMAND_MODULES, COMMANDS

    for mod in COMMAND_MODULES:
        for cmd in importlib.import_module(mod).commands:
            assert COMMANDS.get(cmd.name) == mod, (cmd.name, mod)
