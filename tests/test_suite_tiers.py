"""`make test-unit` runs only in-process tests: a test whose code starts a program, itself or
through a helper of tests/ or bench/, or imports torch, gets a tier of its own
(tests/conftest.py), so the unit tier stays a half-minute run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import sdc_cross
from tests.conftest import _code_tiers, flaky_tests
from tests.fixtures.controller import ControllerProcess


def _start_the_cli() -> None:
    subprocess.run([sys.executable, "-m", "babysitter.cli.main", "--help"], check=True)


def _through_a_helper() -> None:
    _start_the_cli()


def _through_a_class_of_tests(cfg: object) -> None:
    ControllerProcess(cfg).start()  # type: ignore[arg-type]


def _through_a_module_of_bench() -> None:
    sdc_cross.measure(n=8)  # device processes (multiprocessing)


def _with_torch() -> object:
    import torch

    return torch.zeros(1)


def _pure(xs: list[int]) -> list[int]:
    return sorted(x * 2 for x in xs)


def test_code_that_starts_a_program_is_in_the_process_tier_even_through_helpers():
    assert _code_tiers(_start_the_cli) == {"process"}
    assert _code_tiers(_through_a_helper) == {"process"}
    assert _code_tiers(_through_a_class_of_tests) == {"process"}
    assert _code_tiers(_through_a_module_of_bench) == {"process"}


def test_importing_torch_is_slow_and_plain_logic_has_no_tier():
    assert _code_tiers(_with_torch) == {"slow"}
    assert _code_tiers(_pure) == frozenset()


def test_the_unit_tier_is_what_nothing_else_claims(request: pytest.FixtureRequest):
    # this test starts nothing and uses no fixture that does: it is a unit test
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("process") is None


def test_a_test_whose_setup_fails_on_the_rerun_too_is_not_listed_as_flaky():
    def rep(nodeid: str) -> object:
        return SimpleNamespace(nodeid=nodeid)

    stats: dict[str, list[object]] = {
        "rerun": [rep("t.py::flake"), rep("t.py::broken_call"), rep("t.py::broken_setup")],
        "failed": [rep("t.py::broken_call")],
        "error": [rep("t.py::broken_setup")],  # a fixture that failed on both runs
        "passed": [rep("t.py::flake")],
    }
    assert flaky_tests(stats) == ["t.py::flake"]


_GROUPED_TESTS = """
import json
import os
import pytest

def _record(group):
    with open("workers.txt", "a") as f:
        f.write(f"{group} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.xdist_group("cluster(a)")
@pytest.mark.parametrize("i", range(4))
def test_a(i):
    _record("a")

@pytest.mark.xdist_group("cluster(b)")
@pytest.mark.parametrize("i", range(4))
def test_b(i):
    _record("b")

@pytest.mark.parametrize("i", range(4))
def test_free(i):
    pass
"""


def _run_with_groups(tmp_path: Path, tests: str, *argv: str, name: str = "test_grouped.py") -> None:
    """`tests` as a test file beside a conftest loading tests/xdist_groups.py, run by a real
    pytest on xdist workers (--dist loadgroup, as make test); it must pass."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.xdist_groups"]\n')
    (tmp_path / name).write_text(tests)
    repo = Path(__file__).resolve().parent.parent
    r = subprocess.run(
        [sys.executable, "-m", "pytest", *argv, "--dist", "loadgroup", "-q"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_group_of_tests_runs_on_one_worker_in_a_parallel_run(tmp_path):
    """make test's workers (--dist loadgroup): the tests of one cluster on one worker, each
    cluster started once (tests/xdist_groups.py: lost under pytest 9.2 without it)."""
    _run_with_groups(tmp_path, _GROUPED_TESTS, "-n", "2", "-p", "no:cacheprovider")
    workers: dict[str, set[str]] = {}
    for line in (tmp_path / "workers.txt").read_text().splitlines():
        group, worker = line.split()
        workers.setdefault(group, set()).add(worker)
    assert workers.keys() == {"a", "b"}
    assert all(len(w) == 1 for w in workers.values()), workers


_UNEVEN_TESTS = """
import pytest

def _record(name):
    with open("order.txt", "a") as f:
        f.write(name + "\\n")

@pytest.mark.xdist_group("many")
@pytest.mark.parametrize("i", range(3))
def test_many_quick(i):
    _record("many")

def test_one_long():
    _record("long")
"""


def test_a_parallel_run_starts_the_unit_that_took_longest_last_time(tmp_path):
    """make test's workers get the longest work unit first (tests/xdist_groups.py), here one
    test that took 100 s last run before a group of three quick ones (loadgroup alone would
    start the group: more tests); the run records each unit's seconds for the next run."""
    cached = tmp_path / ".pytest_cache" / "v" / "babysitter" / "xdist_unit_seconds"
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps({"test_uneven.py::test_one_long": 100.0, "many": 0.1}))
    _run_with_groups(tmp_path, _UNEVEN_TESTS, "-n", "1", name="test_uneven.py")
    assert (tmp_path / "order.txt").read_text().split() == ["long", "many", "many", "many"]
    seconds = json.loads(cached.read_text())
    assert seconds.keys() == {"test_uneven.py::test_one_long", "many"}
    assert all(0 < s < 100 for s in seconds.values())  # this run's, not the last one's
