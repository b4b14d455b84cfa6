"""Shared pytest set-up. Area fixtures live in tests/fixtures/<area>.py and are listed here.

Tiers come from the fixtures a test uses and from what its code does: a test whose fixtures
start Slurm daemons is `slurm`, one on a real PostgreSQL `postgres`, one on the docker cluster
`docker`; one whose code or tests/ helpers start a program (the controller, the agent, the CLI,
Alertmanager) is `process`, one that imports torch `slow`; a test with none of them is `unit`
(`make test-unit`: in-process logic, no Slurm, no Postgres, no docker, no programs started).
Only where nothing in the code can tell is a tier marked by hand (`slow`: a 10,000-node run).
Under pytest-xdist, tests that share one session or module cluster fixture get the same xdist
group, so each cluster is started once, on one worker (`--dist loadgroup`)."""

from __future__ import annotations

import functools
import inspect
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import CodeType

import pytest
from _pytest.fixtures import FixtureDef

pytest_plugins: list[str] = [
    # "tests.fixtures.<area>",
    "tests.fixtures.slurm",
    "tests.fixtures.gpu",
    "tests.fixtures.controller",
    "tests.fixtures.alerts",
    "tests.fixtures.users",
    "tests.xdist_groups",  # xdist_group kept on one worker under pytest 9.2
    "tests.summary_lines",  # lines a test prints at the end of the run (under xdist too)
]

# The fixture that puts a test in a tier. Cluster fixtures depend on `slurm_daemons`, so a test
# that uses any of them (directly or through another fixture) is found by this table.
TIER_OF_FIXTURE = {
    "slurm_daemons": "slurm",
    "slurm2511_prefix": "slurm2511",  # Slurm 25.11 built from source (make test builds it first)
    "pg_admin_dsn": "postgres",
    "docker_engine": "docker",
    "wheel_venv": "slow",  # builds the wheel and installs it into a fresh venv
    "built_packages": "slow",  # `make package`: the venv, the .deb and .rpm packages
}


@pytest.hookimpl(tryfirst=True)  # before the tmp_path plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    # A short base temp: slurmstepd's unix socket (<base>/.../spool/<node>_<job>.<step>) must
    # stay under 108 bytes, and xdist adds a popen-gwN level below the base. Each run gets
    # its own directory (pytest empties a given --basetemp), so runs never share files.
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="bst-", dir="/tmp")


# request.getfixturevalue("name") in a test or fixture: used, though not in the signature
_GETFIXTUREVALUE = re.compile(r"""getfixturevalue\(\s*["'](\w+)["']""")


# a cluster built in the test or fixture itself starts the host's Slurm daemons
_STARTS_SLURM = re.compile(r"\b(?:SimCluster|DevCluster)\(")


TESTS = Path(__file__).resolve().parent
# where the helpers tests call live: tests/ and bench/ (stand-ins and measurements tests reuse)
_HELPER_DIRS = (TESTS, TESTS.parent / "bench")

# What a test's code (or a helper of tests/ or bench/ it calls) does that takes it out of `unit`:
# starting a program (`process`: the controller, the agent, the CLI, Alertmanager, promtool) or
# importing torch (`slow`: seconds of import on its own).
_SPAWNS = frozenset(
    {"Popen", "check_output", "check_call", "getoutput", "create_subprocess_exec", "fork"}
    | {"create_subprocess_shell", "posix_spawn", "ProcessPoolExecutor", "get_context"}
)
_HEAVY_IMPORTS = frozenset({"torch"})


def _code_objects(func: object) -> list[CodeType]:
    code = getattr(func, "__code__", None)
    if code is None:
        return []
    out, todo = [], [code]
    while todo:  # nested functions, lambdas and comprehensions are their own code objects
        c = todo.pop()
        out.append(c)
        todo += [k for k in c.co_consts if isinstance(k, CodeType)]
    return out


def _helpers(func: object) -> list[object]:
    """Functions of tests/ and bench/ that `func` names: module helpers, classes' methods, and
    functions of such a module named as its attributes (`sdc_cross.measure`)."""
    glb = getattr(func, "__globals__", {})
    found: list[object] = []
    for code in _code_objects(func):
        names = code.co_names
        objs = [glb.get(n) for n in names]
        for mod in [o for o in objs if inspect.ismodule(o) and _in_tests(o)]:
            objs += [getattr(mod, n, None) for n in names]
        for obj in objs:
            if obj is None or inspect.ismodule(obj) or not _in_tests(obj):
                continue
            if inspect.isclass(obj):
                for attr in vars(obj).values():
                    attr = getattr(attr, "__func__", getattr(attr, "fget", attr))
                    if inspect.isfunction(attr):
                        found.append(attr)
            elif inspect.isfunction(obj):
                found.append(obj)
    return found


def _in_tests(obj: object) -> bool:
    try:
        path = Path(inspect.getfile(obj)).resolve()  # type: ignore[arg-type]
    except (TypeError, OSError):
        return False
    return any(path.is_relative_to(d) for d in _HELPER_DIRS)


@functools.cache  # per function: helpers are shared by many tests
def _code_tiers(func: Callable[..., object] | None) -> frozenset[str]:
    """`process` / `slow` for what a function and the tests/ helpers it calls do."""
    tiers: set[str] = set()
    seen: set[object] = set()
    todo: list[object] = [func]
    while todo:
        f = todo.pop()
        if f is None or f in seen or not _in_tests(f):
            continue
        seen.add(f)
        for code in _code_objects(f):
            names = set(code.co_names)
            spawns = names & _SPAWNS or {"subprocess", "run"} <= names or {"os", "system"} <= names
            if spawns:
                tiers.add("process")
            if names & _HEAVY_IMPORTS:
                tiers.add("slow")
        todo += _helpers(f)
    return frozenset(tiers)


@functools.cache  # per function, not per test: getsource tokenizes the whole file
def _requested(func: Callable[..., object] | None) -> tuple[str, ...]:
    """Fixtures a function's code uses beyond its signature."""
    try:
        src = inspect.getsource(func)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ()
    used = _GETFIXTUREVALUE.findall(src)
    return (*used, "slurm_daemons") if _STARTS_SLURM.search(src) else tuple(used)


def _closure_defs(item: pytest.Item) -> dict[str, FixtureDef[object]]:
    """Every fixture the test uses: its signature's closure, the fixtures named by literal
    getfixturevalue calls in the test and in unparametrized fixtures, and those named by a
    parameter value (a parametrized fixture gets the fixture its parameter names: its other
    parameters do not start that fixture), each with its own dependencies."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return {}
    defs = {name: ds[-1] for name, ds in info.name2fixturedefs.items() if ds}
    manager = item.session._fixturemanager
    callspec = getattr(item, "callspec", None)
    todo: list[str] = []
    for value in callspec.params.values() if callspec is not None else ():
        todo += [v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, str)]
    sources = [getattr(item, "function", None)]
    sources += [fd.func for fd in defs.values() if fd.params is None]
    for func in sources:
        todo += _requested(func)
    while todo:
        name = todo.pop()
        if name in defs or not name.isidentifier():
            continue
        found = manager.getfixturedefs(name, item)
        if not found:
            continue
        defs[name] = found[-1]
        todo += list(found[-1].argnames)
        if found[-1].params is None:
            todo += _requested(found[-1].func)
    return defs


def _tiers(item: pytest.Item, defs: dict[str, FixtureDef[object]]) -> set[str]:
    tiers = {TIER_OF_FIXTURE[n] for n in defs if n in TIER_OF_FIXTURE}
    for func in [getattr(item, "function", None), *(fd.func for fd in defs.values())]:
        tiers |= _code_tiers(func)
    callspec = getattr(item, "callspec", None)
    # db_url runs each test on SQLite and on Postgres: only the Postgres variant needs a server
    if callspec is not None and callspec.params.get("db_url") == "postgres":
        tiers.add("postgres")
    if "slurm2511" in tiers:
        tiers.add("slurm")
    return tiers


def _shared_clusters(item: pytest.Item, defs: dict[str, FixtureDef[object]]) -> set[str]:
    """The session/module fixtures of this test that start daemons (with their parameter, so
    each parametrized cluster is its own)."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    out = set()
    for name, fd in defs.items():
        if fd.scope == "function" or name in TIER_OF_FIXTURE:
            continue
        uses = {*fd.argnames, *_requested(fd.func)}
        if uses & {"slurm_daemons", "slurm2511_prefix", "docker_engine"}:
            key = f"{fd.baseid}::{name}" if fd.scope == "module" else name
            # no brackets: xdist reads a node id ending in "]" as one without a group
            out.add(f"{key}({params[name]})" if name in params else key)
    return out


def _find(parent: dict[str, str], x: str) -> str:
    while parent.setdefault(x, x) != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


# tiers a test may carry by hand, where nothing in its code tells (a 10,000-node scale run)
_HAND_TIERS = ("slow", "reliability", "slurm")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook turns xdist_group into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    parent: dict[str, str] = {}
    clusters_of: dict[str, set[str]] = {}
    for item in items:
        defs = _closure_defs(item)
        tiers = _tiers(item, defs)
        if not tiers and not any(item.get_closest_marker(n) for n in _HAND_TIERS):
            tiers = {"unit"}
        for t in sorted(tiers):
            item.add_marker(getattr(pytest.mark, t))
        clusters = _shared_clusters(item, defs)
        clusters_of[item.nodeid] = clusters
        first, *rest = sorted(clusters) or [None]
        if first is not None:
            for other in rest:  # a test on two clusters joins their groups: one worker
                parent[_find(parent, other)] = _find(parent, first)
    for item in items:
        clusters = clusters_of[item.nodeid]
        if clusters:
            group = _find(parent, min(clusters))
            item.add_marker(pytest.mark.xdist_group(group))


def flaky_tests(stats: dict[str, list[object]]) -> list[str]:
    """Tests rerun after a failure that passed on the rerun. One that failed its rerun too is
    listed as failed, or as an error when its setup failed (a fixture that could not start its
    cluster twice is a failure, not a flake)."""
    reruns = {getattr(rep, "nodeid", "") for rep in stats.get("rerun", [])}
    failed = {getattr(rep, "nodeid", "") for k in ("failed", "error") for rep in stats.get(k, [])}
    return sorted(reruns - failed)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """A test that failed and passed on its one rerun (pytest-rerunfailures) is named loudly:
    it is a flake to fix, not a pass to forget."""
    flaky = flaky_tests(terminalreporter.stats)
    if not flaky:
        return
    terminalreporter.section("FLAKY: failed once, passed on rerun", sep="!", red=True, bold=True)
    first: dict[str, str] = {}  # what the first run failed on: the flake's cause, not its name
    for rep in terminalreporter.stats.get("rerun", []):
        crash = getattr(getattr(rep, "longrepr", None), "reprcrash", None)
        line = (getattr(crash, "message", "") or "").strip().splitlines()[:1]
        first.setdefault(rep.nodeid, f" ({rep.when}: {line[0][:300]})" if line else "")
    for nodeid in flaky:
        terminalreporter.line(f"FLAKY {nodeid}{first.get(nodeid, '')}", red=True, bold=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # keep the run's files for a look after a failure, drop them after a pass
    base = session.config.option.basetemp
    if (
        exitstatus == 0
        and base
        and Path(base).name.startswith("bst-")
        and not hasattr(session.config, "workerinput")
        and not os.environ.get("BABYSITTER_KEEP_TEST_FILES")
        and not _mounts_below(Path(base))
    ):
        shutil.rmtree(base, ignore_errors=True)


def _mounts_below(base: Path) -> bool:
    """A mount left below the base (a chroot's bind mount) is never deleted through."""
    prefix = str(base.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        return any(line.split()[1].startswith(prefix) for line in f)
