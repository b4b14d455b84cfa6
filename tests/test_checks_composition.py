"""The explicit list of checks (checks/all.py): what it selects, that the heavy SDC module is
imported only when its check is named, and that event sources exist without selecting checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from babysitter.checks.all import CHECKS, EVENT_SOURCES, compose, select_checks
from babysitter.checks.base import CheckContext
from babysitter.config import parse_config
from babysitter.errors import ConfigError, UsageError


def ctx(tmp_path: Path, **agent: object) -> CheckContext:
    cfg = parse_config(
        {
            "agent": {"sysfs_root": str(tmp_path), "kmsg_path": str(tmp_path / "kmsg"), **agent},
            "checks": {"host": {"check_slurmd": False, "paths": [str(tmp_path)]}},
        }
    )
    return CheckContext(cfg, "n1")


def test_every_entry_makes_the_check_it_names(tmp_path):
    c = ctx(tmp_path)
    names = [e.name for e in CHECKS]
    assert len(names) == len(set(names))
    for entry in CHECKS:
        check = entry.make(c)
        assert check.name == entry.name and check.invasive == entry.invasive


def test_default_selection_leaves_out_invasive_checks(tmp_path):
    names = {c.name for c in select_checks(ctx(tmp_path))}
    assert "host.resources" in names and "xid.kmsg" in names
    assert not names & {"sdc.matmul", "nccl.perf"}


def test_an_invasive_check_runs_when_enabled_checks_names_it(tmp_path):
    names = [c.name for c in select_checks(ctx(tmp_path, enabled_checks=["sdc", "host"]))]
    assert names == ["host.resources", "sdc.matmul"]


def test_only_selects_by_prefix(tmp_path):
    names = [c.name for c in select_checks(ctx(tmp_path), ["xid"])]
    assert names == ["xid.kmsg"]


def test_event_sources_come_with_the_composition(tmp_path):
    comp = compose(ctx(tmp_path, enabled_checks=["host"]))
    assert [c.name for c in comp.checks] == ["host.resources"]
    assert (
        [s.name for s in comp.sources]
        == ["nvml.events"]
        == [make(ctx(tmp_path)).name for make in EVENT_SOURCES]
    )


def test_an_agent_carries_the_sdc_check_by_default_and_a_one_shot_run_does_not(tmp_path):
    """The agent runs sdc.matmul only on the controller's order, under its Slurm hold, so it
    is in the agent's default set; `babysitter check` without --only never takes the GPUs."""
    agent = {c.name for c in compose(ctx(tmp_path)).checks}
    assert "sdc.matmul" in agent and "nccl.perf" not in agent
    assert "sdc.matmul" not in {c.name for c in select_checks(ctx(tmp_path))}


def test_numpy_is_never_imported_by_the_process_that_runs_the_sdc_check(tmp_path):
    """An agent carries the SDC check from the start and never pays for numpy (nor torch):
    the test runs in a child process (checks/sdc/child.py)."""
    code = (
        "import sys\n"
        "from babysitter.checks.all import compose\n"
        "from babysitter.checks.base import CheckContext\n"
        "from babysitter.config import parse_config\n"
        "cfg = parse_config({'agent': {'spool_path': 'spool.db'},\n"
        "                    'checks': {'sdc': {'backend': 'numpy', 'size': 64}}})\n"
        "ctx = CheckContext(cfg, 'n')\n"
        "[sdc] = [c for c in compose(ctx, ['host', 'sdc']).checks if c.name == 'sdc.matmul']\n"
        "print('numpy' in sys.modules)\n"
        "print(sorted({f.code for f in sdc.run()}))\n"
        "print('numpy' in sys.modules)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # the test's state (golden digest, reference) lands here
    )
    assert r.stdout.splitlines() == ["False", "['sdc.ok']", "False"], r.stderr


def test_a_name_that_matches_no_check_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"agent.enabled_checks: gpu.memroy names no check"):
        select_checks(ctx(tmp_path, enabled_checks=["gpu.memory", "gpu.memroy"]))
    with pytest.raises(UsageError, match=r"--only: xdi names no check"):
        select_checks(ctx(tmp_path), ["gpu", "xdi"])


def test_a_signal_override_that_names_no_signal_is_an_error(tmp_path):
    c = ctx(tmp_path)
    c.config.checks.gpu.signal_intervals["gpu.memory/sbe_volatil"] = 30
    with pytest.raises(ConfigError, match=r"checks.gpu.signal_intervals: gpu.memory/sbe_volatil"):
        select_checks(c)
    c.config.checks.gpu.signal_intervals.clear()
    c.config.checks.infiniband.signal_intervals["gpu.memory/sbe_volatile"] = 30  # wrong section
    with pytest.raises(ConfigError, match=r"checks.infiniband.signal_intervals"):
        select_checks(c)
    c.config.checks.infiniband.signal_intervals.clear()
    c.config.checks.gpu.signal_intervals["gpu.memory/sbe_volatile"] = "fast"
    assert select_checks(c, ["host"])
