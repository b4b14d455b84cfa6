"""`make test-unit` runs only in-process tests: a test whose code starts a program, itself or
through a helper of tests/ or bench/, or imports torch, gets a tier of its own
(tests/conftest.py), so the unit tier stays a half-minute run."""

from __future__ import annotations

import subprocess
import sys
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
