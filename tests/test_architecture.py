"""The import contracts in pyproject.toml hold, bite when broken, and the package has no import
cycle."""

from __future__ import annotations

import ast
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
        ("checks/host/check.py", "babysitter.controller.loop.decide.node.policy"),
        # checks/all.py is the composition root: a check importing it would bring back
        # registration by import (and a cycle waiting to happen)
        ("checks/gpu/check.py", "babysitter.checks.all"),
        # the controller is runtime -> api -> loop -> db: persistence knows nothing above it,
        ("controller/db/store.py", "babysitter.controller.loop.decide.node.policy"),
        ("controller/db/models.py", "babysitter.controller.api.ingest"),
        # the loop decides and acts without the HTTP side,
        ("controller/loop/remediation.py", "babysitter.controller.api.auth"),
        # and the API is assembled by runtime, never the other way
        ("controller/api/app.py", "babysitter.controller.runtime"),
        # the tick's decide stage is pure: no store, no Slurm backend, no later stage
        ("controller/loop/decide/node/policy.py", "babysitter.controller.db.store"),
        ("controller/loop/decide/blast.py", "babysitter.controller.loop.admit.admission"),
        ("controller/loop/decide/ladder.py", "babysitter.slurm.cli"),
        # the executor runs no step; admission never acts
        ("controller/loop/act/executor.py", "babysitter.controller.loop.heal.healer"),
        ("controller/loop/admit/admission.py", "babysitter.controller.loop.act.executor"),
    ],
)
def test_contract_bites_when_a_module_imports_what_it_must_not(
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


def test_a_checks_settings_import_nothing_a_config_load_cannot_afford():
    """config.py imports every checks/<name>/settings.py (the one exception to the layers): a
    settings module reaching into its check's code would make every config load pay for NVML,
    sysfs readers, ... and bring back the import cycle the layers prevent."""
    graph = grimp.build_graph("babysitter")
    settings = sorted(
        m for m in graph.modules if m.startswith("babysitter.checks.") and m.endswith(".settings")
    )
    assert len(settings) == 7, settings  # gpu, xid, host, infiniband, nccl, sdc, fabric
    allowed = (
        "babysitter.settings",
        "babysitter.hardware.",
        "babysitter.finding",
        "babysitter.errors",
    )
    for m in settings:
        reached = graph.find_upstream_modules(m)  # what m imports, also indirectly
        assert all(r.startswith(allowed) for r in reached), (m, sorted(reached))


def test_loading_the_config_imports_no_check_code():
    code = (
        "import sys, babysitter.config\n"
        "print(sorted(m for m in sys.modules if m == 'pynvml' or m.endswith('.check')"
        " or m == 'babysitter.checks.base'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


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


MAX_FUNCTION_LINES = 80


def _long_functions(tree: ast.Module, stem: str, limit: int) -> dict[str, int]:
    """'<stem>.<qualified name>' -> line count (def line to last line) of every function,
    method or nested function longer than `limit` lines."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        found[name] = lines
                visit(child, name)
            else:
                visit(child, prefix)

    visit(tree, stem)
    return found


def _package_long_functions(limit: int) -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted((REPO / "babysitter").rglob("*.py")):
        rel = path.relative_to(REPO / "babysitter")
        if {"sql", "versions"} <= set(rel.parts):  # alembic migrations: generated, append-only
            continue
        tree = ast.parse(path.read_text(), str(path))
        found.update({f"{rel}:{k}": v for k, v in _long_functions(tree, path.stem, limit).items()})
    return found


def test_no_function_over_80_lines():
    """A function over 80 lines does several jobs: split it into named steps."""
    assert _package_long_functions(MAX_FUNCTION_LINES) == {}


def test_the_length_check_sees_methods_and_nested_functions():
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    src = (
        f"def short():\n    return 1\n\n"
        f"class C:\n    def long(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n\n"
        f"def outer():\n    def inner():\n    {body.replace(chr(10), chr(10) + '    ')}\n"
        f"    return inner\n"
    )
    assert _long_functions(ast.parse(src), "m", 80) == {
        "m.C.long": 81,
        "m.outer": 83,
        "m.outer.inner": 81,
    }


CONTROLLER_LIMITS = {"module": 500, "class": 400, "function": 60}


def _controller_oversized() -> dict[str, int]:
    """What in babysitter/controller/ is over its limit: modules over 500 lines, classes over
    400, functions over 60 (issue 52: the tick's code a newcomer can hold in their head)."""
    found: dict[str, int] = {}
    for path in sorted((REPO / "babysitter" / "controller").rglob("*.py")):
        rel = str(path.relative_to(REPO / "babysitter"))
        text = path.read_text()
        if (n := len(text.splitlines())) > CONTROLLER_LIMITS["module"]:
            found[rel] = n
        for node in ast.walk(ast.parse(text, rel)):
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > CONTROLLER_LIMITS[kind]:
                found[f"{rel}:{node.name}"] = lines
    return found


def test_controller_modules_classes_and_functions_within_their_limits():
    assert _controller_oversized() == {}
