"""The lemon ledger in a real store: counts by node and by GPU (a renamed node keeps its
history), survives a new Store on the same database (a controller restart), and an admin's
clear stops the rows counting and is itself recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.read.ledger import Ledger, Phase

NOW = datetime(2026, 11, 26, 4, 0, tzinfo=UTC)
WEEK = timedelta(days=7)
ISSUED = {"issued_at": NOW.isoformat()}  # the reboot was asked of Slurm


def _store(path: Path) -> Store:
    s = Store(f"sqlite:///{path}")
    s.upgrade()
    return s


def test_counts_follow_the_gpu_across_a_rename_and_a_restart(tmp_path: Path):
    db = tmp_path / "l.db"
    s = _store(db)
    led = Ledger(s)
    for days in (1, 2, 3):
        added = led.add(
            "gpu-a17",
            Rung.REBOOT,
            "xid.79",
            "XID 79 on GPU 3",
            Phase.REBOOTING,
            NOW - timedelta(days=days),
            gpu_uuid="GPU-3",
            gpu_serial="1650922000123",
            evidence=ISSUED,
        )
        (row,) = [r for r in led.history("gpu-a17") if r.id == added.id]
        assert row == added  # the row as written is the row as read
        led.move(row, Phase.PASSED, NOW - timedelta(days=days), "validated")
    led.add(
        "gpu-a17",
        Rung.REBOOT,
        "xid.79",
        "old",
        Phase.PASSED,
        NOW - timedelta(days=9),
        evidence=ISSUED,
    )
    led.add("gpu-a17", Rung.INSPECT, "xid.74", "inspect", Phase.INSPECT, NOW)
    s.close()

    led = Ledger(_store(db))  # a controller restart: same database, new objects
    assert len(led.counted("gpu-a17", set(), NOW - WEEK)) == 3  # not the 9-day-old one
    # the node was renamed; its GPU (by UUID or by serial) still carries the history
    assert len(led.counted("gpu-b02", {"GPU-3"}, NOW - WEEK)) == 3
    assert len(led.counted("gpu-b02", {"1650922000123"}, NOW - WEEK)) == 3
    assert led.counted("gpu-b02", {"GPU-9"}, NOW - WEEK) == []
    assert [r.state for r in led.open_rows()] == [Phase.INSPECT]


def test_clear_stops_counting_and_is_recorded(tmp_path: Path):
    led = Ledger(_store(tmp_path / "l.db"))
    led.add(
        "n1", Rung.REBOOT, "xid.79", "f", Phase.PASSED, NOW - timedelta(hours=1), evidence=ISSUED
    )
    led.add("n1", Rung.INSPECT, "xid.79", "f", Phase.LEMON, NOW)
    led.add(
        "n2", Rung.REBOOT, "xid.79", "f", Phase.PASSED, NOW - timedelta(hours=1), evidence=ISSUED
    )
    assert led.clear("n1", "admin (alice@login1)", NOW, "GPU reseated") == 2
    assert led.counted("n1", set(), NOW - WEEK) == []
    assert len(led.counted("n2", set(), NOW - WEEK)) == 1
    assert led.open_rows() == []
    newest = led.history("n1")[0]
    assert (newest.state, newest.requested_by, newest.fault) == (
        Phase.CLEARED,
        "admin (alice@login1)",
        "GPU reseated",
    )


def test_only_rungs_carried_out_count(tmp_path: Path):
    """A reset the agent refused (a process held the GPU), a reboot Slurm was never asked for
    and an episode an admin took over before anything ran are no remediations of the node."""
    led = Ledger(_store(tmp_path / "l.db"))
    at = NOW - timedelta(hours=1)
    led.add("n1", Rung.RESET_GPU, "xid.48", "f", Phase.FAILED, at, evidence={"order_id": "o1"})
    led.add(
        "n1",
        Rung.RESET_GPU,
        "xid.48",
        "f",
        Phase.FAILED,
        at,
        evidence={"order_id": "o2", "refused": True},
    )
    led.add("n1", Rung.REBOOT, "xid.79", "scontrol reboot failed", Phase.FAILED, at)
    led.add("n1", Rung.REBOOT, "xid.79", "f", Phase.TAKEN_OVER, at, evidence=ISSUED)
    led.add("n1", Rung.REBOOT, "xid.79", "f", Phase.TIMED_OUT, at, evidence=ISSUED)
    counted = led.counted("n1", set(), NOW - WEEK)
    assert [(r.rung, r.state) for r in counted] == [
        (Rung.RESET_GPU, Phase.FAILED),  # ran (the agent answered it failed)
        (Rung.REBOOT, Phase.TIMED_OUT),
    ]
