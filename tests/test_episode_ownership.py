"""A node someone else drains in the middle of a remediation episode is theirs from then on:
babysitter withdraws what it set in motion (a pending reboot, the validation reservation, a
running validation's verdict), records why, and never reboots, resets, validates, resumes or
re-reasons it again in that episode. Driven through the real engine over the in-memory Slurm
(tests/fixtures/healing.py)."""

from __future__ import annotations

from pathlib import Path

from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.loop.read.ledger import Phase
from tests.fixtures.healing import Cluster, xid79

AUTOMATIC = {"reboot", "drain", "drain_many", "resume", "resume_many", "start_validation"}


def _rebooting(c: Cluster, node: str) -> None:
    """XID 79 on NODE until babysitter has drained it and asked Slurm for its reboot."""
    c.tick()
    c.report(node, xid79())
    for _ in range(3):
        c.tick()
    assert c.ledger(node)[0].state is Phase.REBOOTING
    assert "REBOOT_REQUESTED" in c.slurm.node(node).flags


def test_babysitter_drain_during_a_reboot_episode_stops_every_automatic_action(tmp_path: Path):
    c = Cluster(tmp_path)
    _rebooting(c, "node1")
    mark = len(c.slurm.calls)
    c.admin_drain("node1", "swap the fan")  # `babysitter drain node1 --reason "swap the fan"`
    c.tick()  # the loop carries out the admin's drain ...
    c.tick()  # ... and sees it in its next Slurm listing
    # the pending reboot and the validation reservation are withdrawn, the episode is closed
    assert "cancel_reboot" in c.calls_after(mark, "node1")
    assert "REBOOT_REQUESTED" not in c.slurm.node("node1").flags
    assert "babysitter_validate_node1" not in c.slurm.reservations
    row = c.ledger("node1")[0]
    assert row.state is Phase.TAKEN_OVER and not row.open
    assert "taken over by an admin" in row.outcome and "[manual] swap the fan" in row.outcome
    skipped = [a for a in c.store.actions() if a.kind is ActionKind.REBOOT]
    assert skipped[0].status is ActionStatus.SKIPPED and "taken over" in (skipped[0].outcome or "")

    # the node's power cycle (had the reboot gone ahead) and clean reports: babysitter stays off
    mark = len(c.slurm.calls)
    c.power_cycle("node1")
    for _ in range(6):
        c.report("node1")
        c.tick()
    assert AUTOMATIC.isdisjoint(c.calls_after(mark, "node1"))
    n1 = c.slurm.node("node1")
    assert n1.drained_or_draining and n1.reason == "babysitter: [manual] swap the fan"
    assert [r.state for r in c.ledger("node1")] == [Phase.TAKEN_OVER]
    c.close()


def test_admin_drain_in_slurm_during_validation_keeps_the_verdict_off_the_node(tmp_path: Path):
    c = Cluster(tmp_path)
    _rebooting(c, "node1")
    c.power_cycle("node1")
    c.tick()
    assert c.ledger("node1")[0].state is Phase.VALIDATING
    mark = len(c.slurm.calls)
    c.slurm.admin_drain("node1", "cable work")  # in Slurm itself, not through babysitter
    c.tick()
    assert c.ledger("node1")[0].state is Phase.TAKEN_OVER
    assert "babysitter_validate_node1" not in c.slurm.reservations
    c.slurm.verdict("node1", "FAILED")  # the job's verdict comes after: nobody acts on it
    for _ in range(4):
        c.tick()
    assert AUTOMATIC.isdisjoint(c.calls_after(mark, "node1"))
    assert c.slurm.node("node1").reason == "cable work"
    (validation,) = [a for a in c.store.actions() if a.kind is ActionKind.VALIDATE]
    assert validation.status is ActionStatus.SKIPPED
    c.close()


def test_admin_drain_during_validation_cancels_babysitters_validation_job(tmp_path: Path):
    """The validation job went on stressing the admin's node after the takeover: babysitter
    scancels it (its own job, by the id recorded on the validate action), and says so."""
    c = Cluster(tmp_path)
    _rebooting(c, "node1")
    c.power_cycle("node1")
    c.tick()
    assert c.ledger("node1")[0].state is Phase.VALIDATING
    (validation,) = [a for a in c.store.actions() if a.kind is ActionKind.VALIDATE]
    job = validation.job_id
    assert job is not None and c.slurm.jobs_state[job] == "RUNNING"
    c.slurm.admin_drain("node1", "cable work")
    c.tick()
    assert c.ledger("node1")[0].state is Phase.TAKEN_OVER
    assert c.slurm.jobs_state[job] == "CANCELLED"
    assert [t for op, t in c.slurm.calls if op == "cancel_job"] == [str(job)]
    assert f"validation job {job} cancelled" in c.ledger("node1")[0].outcome
    after = c.store.action(validation.id)
    assert after is not None and f"validation job {job} cancelled" in (after.outcome or "")
    c.close()


def test_an_episode_on_a_node_missing_from_slurm_holds_without_acting(tmp_path: Path):
    """Whose the node is cannot be read: the episode waits (no reboot, no reservation, no
    failure that would climb the ladder) and goes on once Slurm lists the node again."""
    c = Cluster(tmp_path, remediation={"max_concurrent_reboots": 1})
    c.tick()
    c.report("node1", xid79())
    c.tick()
    c.report("node2", xid79())
    for _ in range(3):
        c.tick()
    assert [c.ledger(n)[0].state for n in c.names] == [Phase.REBOOTING, Phase.WAITING]
    gone = c.slurm.forget("node2")
    mark = len(c.slurm.calls)
    c.power_cycle("node1")
    c.tick()
    c.slurm.verdict("node1")
    for _ in range(3):
        c.tick()
    assert c.ledger("node1")[0].state is Phase.PASSED  # the reboot slot is free again ...
    assert c.calls_after(mark, "node2") == []  # ... but node2's owner is unknown: held
    assert [r.state for r in c.ledger("node2")] == [Phase.WAITING]
    c.slurm.restore(gone)
    c.tick()
    assert c.ledger("node2")[0].state is Phase.REBOOTING
    c.close()
