"""The healer's steps through the real engine over the in-memory Slurm (tests/fixtures/healing.py):
what a user sees in Slurm and in the ledger when a reboot never happens, when a validation
verdict is late, and when a node keeps failing."""

from __future__ import annotations

from pathlib import Path

from babysitter.controller.loop.ledger import Phase
from tests.fixtures.healing import Cluster, xid79


def test_a_reboot_that_times_out_is_cancelled_in_slurm(tmp_path: Path):
    """Jobs kept node1 busy past reboot_timeout_s: the page says it is not back, and the
    reboot Slurm still holds pending is withdrawn, so it cannot happen later, unwatched."""
    c = Cluster(tmp_path, remediation={"reboot_timeout_s": 600})
    c.tick()
    c.report("node1", xid79())
    for _ in range(3):
        c.tick()
    assert c.ledger("node1")[0].state is Phase.REBOOTING
    c.tick(601)
    row = c.ledger("node1")[0]
    assert row.state is Phase.TIMED_OUT and "pending reboot cancelled" in row.outcome
    assert ("cancel_reboot", "node1") in c.slurm.calls
    assert "REBOOT_REQUESTED" not in c.slurm.node("node1").flags
    assert c.slurm.node("node1").drained_or_draining  # stays out of service for a human
    c.close()
