"""`--dist loadgroup` that keeps each xdist_group on one worker under pytest 9.2.

pytest-xdist (3.8) hands a test's group to its scheduler as a suffix of the test's node id
(`path::test@group`), written to `item._nodeid`. pytest 9.2 reads node ids from a structured
`item._id` instead, so the suffix is lost and every test is scheduled on its own: a module's
cluster is started on several workers at once and its tests, written to run in order on one
cluster, run apart (pytest-dev/pytest-xdist#1386, open). After xdist's own hook, a grouped test
whose node id still has no suffix gets it here; once xdist sets it, nothing is done twice.

Work units (a group, or a test in none) are handed out longest first, by the seconds each took
in this checkout's last run (pytest's cache), else by tests/xdist_unit_seconds.json (units of
3 s or more in a warm `make test` on 4 workers, 2 cores), else 1 s a test: loadgroup's own
order (most tests first) started the 93 s torch group or a 50 s test last, and the run ended
on one busy worker while the others had nothing left.

Loaded by tests/conftest.py (pytest_plugins), and by tests/test_suite_tiers.py's checks that the
grouping and the order hold in a real parallel run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def group_of(item: pytest.Item) -> str | None:
    """The group xdist schedules by: its marks' names joined as xdist joins them."""
    names = {
        str(m.args[0] if m.args else m.kwargs.get("name", "default"))
        for m in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) or None


@pytest.hookimpl(trylast=True)  # after xdist's worker hook, which may have set it already
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    for item in items:
        group = group_of(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue
        nodeid = f"{item.nodeid}@{group}"
        if hasattr(item, "_id"):  # pytest >= 9.2: structured ids
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(nodeid)
        else:
            item._nodeid = nodeid


# ---- the longest work units first

CACHE_KEY = "babysitter/xdist_unit_seconds"
SEED = Path(__file__).with_name("xdist_unit_seconds.json")


def _scheduler_class() -> type:
    from xdist.scheduler import LoadGroupScheduling

    class LongestFirst(LoadGroupScheduling):
        """loadgroup's scheduler, with the work units (a group, or a test of none) handed out
        longest first (the module's docstring). Which tests run, and where each group runs (one
        worker), is loadgroup's."""

        seconds: dict[str, float] = {}
        _sorted = False

        def _assign_work_unit(self, node):  # type: ignore[no-untyped-def]
            if not self._sorted:
                self._sorted = True
                units = sorted(
                    self.workqueue.items(),
                    key=lambda kv: -self.seconds.get(kv[0], float(len(kv[1]))),
                )
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return LongestFirst


def unit_of(nodeid: str) -> str:
    """The work unit loadgroup schedules a test in: its group, or the test alone (xdist's
    LoadGroupScheduling._split_scope)."""
    return nodeid.split("@")[-1] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: a run with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if (
        getattr(config.option, "dist", None) != "loadgroup"
        or getattr(config, "cache", None) is None
    ):
        return None
    cls = _scheduler_class()
    cls.seconds = {**json.loads(SEED.read_text()), **config.cache.get(CACHE_KEY, {})}
    return cls(config, log)


class _UnitSeconds:
    """On the controller: each work unit's seconds (setup, call and teardown of its tests),
    written to pytest's cache at the end for the next run's order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        unit = unit_of(report.nodeid)
        self.seconds[unit] = self.seconds.get(unit, 0.0) + report.duration

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(session.config, "cache", None)
        if cache is not None and self.seconds:
            cache.set(CACHE_KEY, {**cache.get(CACHE_KEY, {}), **self.seconds})


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and getattr(config.option, "dist", None) == "loadgroup":
        config.pluginmanager.register(_UnitSeconds(), "babysitter-xdist-unit-seconds")
