"""Host checks (psutil) on this machine: disk space, required mounts, slurmd, clean run."""

from __future__ import annotations

import psutil
import pytest

from babysitter.checks.base import CheckContext
from babysitter.checks.host.check import HostCheck
from babysitter.config import parse_config


def run(tmp_path, **host):
    cfg = parse_config(
        {"checks": {"host": {"paths": [str(tmp_path)], "check_slurmd": False, **host}}}
    )
    return HostCheck(CheckContext(cfg, "n1")).run()


def codes(findings):
    return {(f.code, str(f.severity)) for f in findings}


def test_clean_host(tmp_path):
    assert codes(run(tmp_path, min_free_gb=0, min_free_memory_fraction=0)) == {("host.ok", "ok")}


def test_low_disk_and_unreadable_path(tmp_path):
    out = run(tmp_path, min_free_gb=10**9)
    assert ("disk.low", "warning") in codes(out)
    out = run(tmp_path / "missing", min_free_gb=0)
    assert ("disk.unreadable", "warning") in codes(out)


def test_missing_required_mount_is_critical(tmp_path):
    out = run(tmp_path, min_free_gb=0, mounts=["/", str(tmp_path / "lustre")])
    [f] = [f for f in out if f.code == "mount.missing"]
    assert f.severity == "critical" and "lustre" in f.message


def _slurmd_running() -> bool:
    return any(p.info["name"] == "slurmd" for p in psutil.process_iter(["name"]))


def test_slurmd_presence_matches_the_process_table(tmp_path):
    # other tests (xdist workers) start and stop slurmds: compare with a process table that
    # was the same before and after the check ran
    for _ in range(20):
        before = _slurmd_running()
        out = run(tmp_path, min_free_gb=0, check_slurmd=True)
        if _slurmd_running() == before:
            break
    else:
        pytest.fail("slurmd kept starting and stopping during the check")
    assert (("slurmd.not_running", "warning") in codes(out)) is (not before)
