"""`--dist loadgroup` that keeps each xdist_group on one worker under pytest 9.2.

pytest-xdist (3.8) hands a test's group to its scheduler as a suffix of the test's node id
(`path::test@group`), written to `item._nodeid`. pytest 9.2 reads node ids from a structured
`item._id` instead, so the suffix is lost and every test is scheduled on its own: a module's
cluster is started on several workers at once and its tests, written to run in order on one
cluster, run apart (pytest-dev/pytest-xdist#1386, open). After xdist's own hook, a grouped test
whose node id still has no suffix gets it here; once xdist sets it, nothing is done twice.

Loaded by tests/conftest.py (pytest_plugins), and by tests/test_suite_tiers.py's check that the
grouping holds in a real parallel run."""

from __future__ import annotations

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
