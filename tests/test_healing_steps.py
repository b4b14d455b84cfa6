"""The healer's steps through the real engine over the in-memory Slurm (tests/fixtures/healing.py):
what a user sees in Slurm and in the ledger when a reboot never happens, when a validation
verdict is late, and when a node keeps failing."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.heal.lemons import drain_lemons
from babysitter.controller.loop.read.ledger import Phase, Remediation
from babysitter.slurm.client import SlurmNode, SlurmNodeSettling, SlurmUnavailable
from tests.fixtures.healing import Cluster, sdc_mismatch, xid48, xid79


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


def _drains(c: Cluster, node: str) -> int:
    return sum(
        1
        for a in c.store.actions()
        if a.kind is ActionKind.DRAIN and a.node == node and a.status is ActionStatus.DONE
    )


def test_a_fault_no_rung_addresses_makes_a_lemon_instead_of_cycling(tmp_path: Path):
    """An intermittent SDC mismatch: drained, clean, resumed, again. The third drain in the
    window (`[policy] lemon_drains`) makes a lemon that stays drained for an admin, with the
    lemon alert; the admin's `ledger clear` starts the count again."""
    c = Cluster(tmp_path)
    c.tick()
    for _ in range(5):
        c.report("node1", sdc_mismatch())
        c.tick()
        c.report("node1")  # the next report is clean
        c.tick()
        c.tick()
    assert _drains(c, "node1") == 3  # not 5: the cycle stopped at the third
    n1 = c.slurm.node("node1")
    assert n1.drained_or_draining and n1.reason.startswith("babysitter: lemon: 3 drains in 7 days")
    (lemon,) = [r for r in c.ledger("node1") if r.state is Phase.LEMON]
    assert lemon.open and "GPU 2 miscomputed a reference matmul" in lemon.fault
    assert "node1|lemon_node" in c.engine.router.firing_keys()
    c.engine.healer.ledger.clear("node1", "admin", c.now, "GPU 2 replaced")
    c.report("node1")
    c.tick()
    c.tick()
    assert not c.slurm.node("node1").drained_or_draining  # the admin's way back works
    c.close()


def _reset_refused_then_reboot(c: Cluster, node: str) -> None:
    """XID 48 on NODE; the agent refuses the GPU reset (a process holds the GPU), the reboot
    that follows heals it and the validation passes."""
    c.report(node, xid48())
    for _ in range(2):
        c.tick()
    row = c.ledger(node)[0]
    if row.state is not Phase.RESETTING:
        return  # a lemon already
    refused = {
        "order": row.evidence["order_id"],
        "ok": False,
        "refused": True,
        "message": "GPU reset refused: 1 process(es) still on GPU 3",
    }
    c.report(node, xid48(), gpu_reset=refused)
    c.tick()
    assert c.ledger(node)[0].state is Phase.REBOOTING
    c.power_cycle(node)
    c.tick()
    c.slurm.verdict(node)
    c.tick()
    c.tick()


def test_a_refused_reset_is_no_remediation_and_the_lemon_follows_the_third_rung(tmp_path: Path):
    """Three automatic rungs carried out within the window, then the next fault is a lemon
    (docs/self-healing.md): a reset the agent refused never ran and does not count."""
    c = Cluster(tmp_path)
    c.tick()
    for n in (1, 2, 3):
        _reset_refused_then_reboot(c, "node1")
        passed = [r for r in c.ledger("node1") if r.state is Phase.PASSED]
        assert len(passed) == n, [(r.rung, r.state) for r in c.ledger("node1")]
    assert sum(1 for op, n in c.slurm.calls if op == "reboot" and n == "node1") == 3
    c.report("node1", xid48())
    c.tick()
    c.tick()
    assert c.ledger("node1")[0].state is Phase.LEMON
    assert c.slurm.node("node1").reason.startswith("babysitter: lemon: 3 remediations in 7 days")
    c.close()


def test_a_node_the_ladder_heals_is_never_a_drain_lemon_between_its_rungs(tmp_path: Path):
    """XID 79 three times, each healed by a reboot: the reboot clears the XID, so while the
    third episode validates nothing remediable is open, and the policy's drain count (3 in the
    window) asked for a lemon: the node was held drained as '3 drains in 7 days' instead of
    coming back (Slurm 25.11's devcluster run). The ledger counts such a node; its lemon comes
    with the next fault, after three rungs carried out."""
    c = Cluster(tmp_path)
    c.tick()
    for n in (1, 2, 3):
        c.report("node1", xid79())
        for _ in range(3):
            c.tick()
        assert c.ledger("node1")[0].state is Phase.REBOOTING, n
        c.power_cycle("node1")
        c.tick()
        c.slurm.verdict("node1")
        c.tick()
        c.tick()
        passed = [r for r in c.ledger("node1") if r.state is Phase.PASSED]
        assert len(passed) == n, [(r.rung, r.state) for r in c.ledger("node1")]
        assert not c.slurm.node("node1").drained_or_draining, c.slurm.node("node1").reason
    # what the healer asks when the policy's escalation meets the node drained between its
    # rungs' steps (on the devcluster: the passed episode closed, the resume not yet done):
    # three policy drains in the window, nothing remediable open after the reboot
    assert drain_lemons(c.store, {"node1"}, c.now, 7.0, 3) == {}
    c.report("node1", xid79())
    c.tick()
    c.tick()
    assert c.slurm.node("node1").reason.startswith("babysitter: lemon: 3 remediations in 7 days")
    c.close()


def test_a_late_verdict_finds_the_node_drained_not_back_in_service(tmp_path: Path):
    """The validation job has no verdict yet when the node's reservation is about to end (the
    job waited, the controller was slow): the node is drained before the reservation ends, so
    it never returns to Slurm unvalidated; the passing verdict, when it comes, returns it."""
    c = Cluster(tmp_path, remediation={"reboot_timeout_s": 600})
    c.tick()
    c.report("node1", xid79())
    for _ in range(3):
        c.tick()
    issued = c.now
    c.power_cycle("node1")
    c.tick()
    assert c.ledger("node1")[0].state is Phase.VALIDATING
    assert not c.slurm.node("node1").drained_or_draining  # in its reservation, for the job
    # the reservation ends 10 + 25 minutes after the reboot was issued (reboot_timeout_s and the
    # job's 20-minute limit + 5); the verdict is not there 34 minutes after
    while c.now < issued + timedelta(minutes=34):
        c.tick(60)
    n1 = c.slurm.node("node1")
    assert n1.drained_or_draining and "no verdict before its reservation ends" in n1.reason
    assert c.ledger("node1")[0].state is Phase.VALIDATING  # still waiting for it
    c.slurm.verdict("node1")
    c.tick()
    c.tick()
    assert c.ledger("node1")[0].state is Phase.PASSED
    assert not c.slurm.node("node1").drained_or_draining  # validated, then back
    c.close()


def test_a_validation_with_no_verdict_by_its_deadline_fails_the_rung(tmp_path: Path):
    """The job is still PENDING when the late drain comes: it can never start on the drained
    node, and the episode stayed `validating` for good with no page. No verdict by the
    reservation's end + the job's time limit + grace is a failed validation: the job is
    cancelled, the node stays drained, the rung fails and the ladder climbs, paged."""
    c = _back_from_reboot(tmp_path)
    c.tick()
    started = c.now
    assert c.ledger("node1")[0].state is Phase.VALIDATING
    (validation,) = [a for a in c.store.actions() if a.kind is ActionKind.VALIDATE]
    job = validation.job_id
    assert job is not None
    c.slurm.jobs_state[job] = "PENDING"  # never started (the node was busy, the queue long)
    # its reservation ends 25 minutes after it started (the job's 20-minute limit + 5): the
    # node is drained then; the deadline is the job's limit + 5 minutes after that
    while c.now < started + timedelta(minutes=49):
        c.tick(60)
    assert c.slurm.node("node1").drained_or_draining
    assert c.ledger("node1")[0].state is Phase.VALIDATING  # the job may still start and run
    while c.now < started + timedelta(minutes=51):
        c.tick(60)
    assert c.slurm.jobs_state[job] == "CANCELLED"
    failed = c.store.action(validation.id)
    assert failed is not None and failed.status is ActionStatus.FAILED
    assert "no verdict by" in (failed.outcome or "")
    n1 = c.slurm.node("node1")
    assert n1.drained_or_draining and "validation failed: no verdict by" in n1.reason
    rows = c.ledger("node1")
    assert [r.state for r in rows if r.state is Phase.FAILED], [(r.rung, r.state) for r in rows]
    failed_row = next(r for r in rows if r.state is Phase.FAILED)
    assert "no verdict by" in failed_row.outcome
    assert rows[0].open and rows[0].id != failed_row.id  # the next rung
    assert "node1|validation_failed" in c.engine.router.firing_keys()
    c.close()


def test_a_validation_an_older_version_left_waiting_for_ever_gets_a_deadline(tmp_path: Path):
    """Rows an older version drained for their verdict carry no deadline (they waited for
    ever): they get one (the job's time limit + 5 min from now) and then fail as above."""
    c = Cluster(tmp_path)
    _validating(c)
    (validation,) = [a for a in c.store.actions() if a.kind is ActionKind.VALIDATE]
    assert validation.job_id is not None
    c.slurm.jobs_state[validation.job_id] = "PENDING"
    c.slurm.drain("node1", "validation: no verdict before its reservation ends")
    c.store.update_action(
        validation.id,
        next_attempt_at=None,
        outcome=f"{validation.outcome}; drained until its verdict",
    )
    upgraded = c.now
    while c.now < upgraded + timedelta(minutes=24):
        c.tick(60)
    assert c.ledger("node1")[0].state is Phase.VALIDATING
    while c.now < upgraded + timedelta(minutes=26):
        c.tick(60)
    failed = c.store.action(validation.id)
    assert failed is not None and failed.status is ActionStatus.FAILED
    assert "no verdict by" in (failed.outcome or "")
    assert c.slurm.jobs_state[validation.job_id] == "CANCELLED"
    assert c.ledger("node1")[0].state is not Phase.VALIDATING
    c.close()


def _validating(c: Cluster) -> None:
    """XID 79 on node1: drained, rebooted through Slurm, back, and its validation running."""
    c.tick()
    c.report("node1", xid79())
    for _ in range(3):
        c.tick()
    c.power_cycle("node1")
    c.tick()
    assert c.ledger("node1")[0].state is Phase.VALIDATING


def _back_from_reboot(tmp_path: Path) -> Cluster:
    """XID 79 on node1: drained, rebooted through Slurm, and back (a new boot, clean)."""
    c = Cluster(tmp_path, remediation={"reboot_timeout_s": 600})
    c.tick()
    c.report("node1", xid79())
    for _ in range(3):
        c.tick()
    assert c.ledger("node1")[0].state is Phase.REBOOTING
    c.power_cycle("node1")
    return c


def test_a_held_validation_start_is_asked_again_not_a_failed_rung(tmp_path: Path):
    """The admission step holds the validation after the reboot (node1's state could not be
    read from Slurm right then): that came back as "held: ..." and failed the rung, climbed
    the ladder and paged. Held is not failed: the validation starts on a later tick."""
    c = _back_from_reboot(tmp_path)
    real = c.slurm.node

    def unreadable(name: str) -> SlurmNode:
        if name == "node1":
            raise SlurmUnavailable("node1: slurmctld busy")
        return real(name)

    c.slurm.node = unreadable  # type: ignore[method-assign]
    c.tick()
    c.slurm.node = real  # type: ignore[method-assign]
    (row,) = c.ledger("node1")
    assert row.state is Phase.REBOOTING and row.open and "held" in row.outcome
    assert "node1|remediation_inspect" not in c.engine.router.firing_keys()  # no climb
    assert not [a for a in c.store.actions() if a.status is ActionStatus.FAILED]
    assert "cluster|admission_held" in c.engine.router.firing_keys()
    c.tick()
    (row,) = c.ledger("node1")
    assert row.state is Phase.VALIDATING and row.rung.value == "reboot"
    (validation,) = [a for a in c.store.actions() if a.kind is ActionKind.VALIDATE]
    assert validation.status is ActionStatus.RUNNING
    c.slurm.verdict("node1")
    c.tick()
    c.tick()
    assert c.ledger("node1")[0].state is Phase.PASSED
    c.close()


def _settling(c: Cluster, times: int) -> list[int]:
    """Slurm refuses node1's resume into its validation `times` times, as a node back from a
    reboot can ("Invalid node state specified"); the count of tries so far."""
    real = c.slurm.start_validation
    tries = [0]

    def refusing(node: str, *args: Any) -> int:
        tries[0] += 1
        if node == "node1" and tries[0] <= times:
            raise SlurmNodeSettling("resume node1: Invalid node state specified")
        return real(node, *args)

    c.slurm.start_validation = refusing  # type: ignore[method-assign]
    return tries


def test_a_reboot_whose_node_slurm_will_not_return_yet_is_validated_on_a_later_tick(
    tmp_path: Path,
):
    """Back from its reboot, Slurm refused node1's resume for a while (seen in cold runs): that
    failed the reboot rung and paged. It is not a verdict on the node: it stays drained and the
    validation starts once Slurm lets it."""
    c = _back_from_reboot(tmp_path)
    tries = _settling(c, times=2)
    for _ in range(2):
        c.tick()
        (row,) = c.ledger("node1")
        assert row.state is Phase.REBOOTING and row.open and "not started yet" in row.outcome
        sn = c.slurm.node("node1")
        assert sn.down or sn.drained_or_draining  # out of service meanwhile
    assert "node1|remediation_inspect" not in c.engine.router.firing_keys()  # no climb
    c.tick()
    assert tries[0] == 3
    (row,) = c.ledger("node1")
    assert row.state is Phase.VALIDATING and row.rung.value == "reboot"
    c.slurm.verdict("node1")
    c.tick()
    c.tick()
    assert c.ledger("node1")[0].state is Phase.PASSED
    c.close()


def test_a_node_slurm_never_returns_after_its_reboot_fails_the_rung_when_its_hold_ends(
    tmp_path: Path,
):
    """Held for ever would leave it drained with nobody told: once the reboot's reservation
    (reboot_timeout_s + the validation's time) is over, the rung fails and on-call is paged."""
    c = _back_from_reboot(tmp_path)
    _settling(c, times=10**6)
    c.tick()
    assert c.ledger("node1")[0].state is Phase.REBOOTING
    for _ in range(40):  # 40 x 120 s: past 600 s + the validation job's time limit
        c.tick(120)
    rows = c.ledger("node1")
    (row,) = [r for r in rows if r.rung.value == "reboot"]
    assert not row.open and rows[0].rung.value == "inspect", rows  # the ladder's last rung
    assert "validation never started" in row.outcome, row
    sn = c.slurm.node("node1")
    assert sn.down or sn.drained_or_draining
    assert "node1|remediation_inspect" in c.engine.router.firing_keys(), "on-call not paged"
    c.close()


def test_a_reset_node_slurm_never_returns_to_its_validation_fails_the_rung_in_time(
    tmp_path: Path,
):
    """After a GPU reset no reservation bounds the hold: Slurm refusing the node's return into
    its validation for ever left it drained with nobody told. Held past the validation's time
    (its time limit + 5 min) from the reset's answer, the rung fails and the ladder climbs."""
    c = Cluster(tmp_path)
    row = _reset_ordered(c)
    _settling(c, times=10**6)
    done = {"order": row.evidence["order_id"], "ok": True, "message": "GPU 3 reset"}
    c.report("node1", gpu_reset=done)
    c.tick()
    c.report("node1")  # the full report after the reset's answer
    c.tick()
    (row,) = c.ledger("node1")
    assert row.state is Phase.RESETTING and row.open and "not started yet" in row.outcome
    for _ in range(40):  # 40 x 120 s: past the validation job's time limit + 5 min
        c.tick(120)
        c.report("node1")
    rows = c.ledger("node1")
    (reset,) = [r for r in rows if r.rung.value == "reset_gpu"]
    assert not reset.open and "validation never started" in reset.outcome, rows
    assert rows[0].rung.value != "reset_gpu", rows  # the ladder went on
    sn = c.slurm.node("node1")
    assert sn.down or sn.drained_or_draining
    c.close()


def _reset_ordered(c: Cluster) -> Remediation:
    """XID 48 on node1: drained, its GPU reset ordered from the agent (no answer yet)."""
    c.tick()
    c.report("node1", xid48())
    for _ in range(2):
        c.tick()
    row = c.ledger("node1")[0]
    assert row.state is Phase.RESETTING
    return row


def test_a_held_validation_after_a_gpu_reset_is_asked_again_once_reset(tmp_path: Path):
    """The same after a GPU reset: the validation is asked again on the next tick, and the
    agent's answer is recorded once (not once per held tick)."""
    c = Cluster(tmp_path)
    row = _reset_ordered(c)
    done = {"order": row.evidence["order_id"], "ok": True, "message": "GPU 3 reset"}
    c.report("node1", gpu_reset=done)
    real = c.slurm.node

    def unreadable(name: str) -> SlurmNode:
        if name == "node1":
            raise SlurmUnavailable("node1: slurmctld busy")
        return real(name)

    c.slurm.node = unreadable  # type: ignore[method-assign]
    c.tick()
    c.tick()
    c.slurm.node = real  # type: ignore[method-assign]
    (row,) = c.ledger("node1")
    assert row.state is Phase.RESETTING and row.open and "held" in row.outcome
    assert not [a for a in c.store.actions() if a.status is ActionStatus.FAILED]
    c.tick()
    (row,) = c.ledger("node1")
    assert row.state is Phase.VALIDATING and row.rung.value == "reset_gpu"
    resets = [a for a in c.store.actions() if a.kind is ActionKind.RESET_GPU]
    assert [a.outcome.split(" (")[0] for a in resets if a.outcome] == [
        "GPU 3 reset",
        "ordered from the agent",
    ]
    c.close()


def test_a_lemon_stays_paged_while_the_maintenance_windows_cannot_be_read(tmp_path: Path):
    """A tick that holds (windows unreadable, Slurm away) asserts nothing new, yet the lemon is
    still a lemon: its page must not resolve and fire again with every held tick."""
    c = Cluster(tmp_path)
    c.tick()
    for _ in range(3):
        c.report("node1", sdc_mismatch())
        c.tick()
        c.report("node1")
        c.tick()
        c.tick()
    assert "node1|lemon_node" in c.engine.router.firing_keys()

    def unreadable(at=None):
        raise RuntimeError("database is locked")

    real = c.engine.maintenance.expire
    c.engine.maintenance.expire = unreadable  # type: ignore[method-assign]
    c.tick()
    c.tick()
    assert "cluster|maintenance_unknown" in c.engine.router.firing_keys()
    assert "node1|lemon_node" in c.engine.router.firing_keys()
    c.engine.maintenance.expire = real  # type: ignore[method-assign]

    def away() -> list[SlurmNode]:
        raise SlurmUnavailable("slurmctld not responding")

    c.slurm.nodes = away  # type: ignore[method-assign]
    c.tick(120)
    assert not c.engine.snapshot.ok
    assert "node1|lemon_node" in c.engine.router.firing_keys()
    c.close()


def test_a_lemon_counts_drains_behind_thousands_of_other_actions(tmp_path: Path):
    """Two SDC-mismatch drains of node1, then 6,000 other actions (a busy fleet's requeues),
    then the third drain: still a lemon. The policy's drain count read the newest 5,000
    actions only, so older drains of the window read as none and the node cycled on."""
    from babysitter.controller.db import models as m
    from babysitter.controller.db.actions import Action

    c = Cluster(tmp_path)
    c.tick()
    for _ in range(2):
        c.report("node1", sdc_mismatch())
        c.tick()
        c.report("node1")
        c.tick()
        c.tick()
    assert _drains(c, "node1") == 2 and not c.slurm.node("node1").drained_or_draining
    busy = Action(
        ActionKind.REQUEUE, reason="node failure elsewhere", status=ActionStatus.DONE
    ).created(c.now)
    with c.store.engine.begin() as conn:
        conn.execute(m.actions.insert(), [busy.columns() for _ in range(6000)])
    c.report("node1", sdc_mismatch())
    c.tick()
    c.report("node1")
    c.tick()
    c.tick()
    n1 = c.slurm.node("node1")
    assert n1.drained_or_draining and n1.reason.startswith("babysitter: lemon: 3 drains in 7 days")
    c.close()


def test_a_validation_behind_hundreds_of_actions_still_ends_its_episode(tmp_path: Path):
    """While node1's validation job runs, a busy fleet records 600 other actions. Its verdict
    must still end the episode: the healer looked for the validation among the newest 500
    actions only, so the episode stayed `validating` for good, and an open episode holds back
    every later drain of the node (the policy's drain is not taken while a validation runs)."""
    from babysitter.controller.db import models as m
    from babysitter.controller.db.actions import Action

    c = Cluster(tmp_path)
    _validating(c)
    busy = Action(
        ActionKind.REQUEUE, reason="node failure elsewhere", status=ActionStatus.DONE
    ).created(c.now)
    with c.store.engine.begin() as conn:
        conn.execute(m.actions.insert(), [busy.columns() for _ in range(600)])
    c.slurm.verdict("node1")
    c.tick()
    c.tick()
    assert c.ledger("node1")[0].state is Phase.PASSED
    c.report("node1", xid48())  # a new fault later: drained again
    c.tick()
    c.tick()
    assert c.slurm.node("node1").drained_or_draining
    c.close()


def test_an_admin_resume_mid_gpu_reset_ends_the_episode_and_its_late_refusal_is_ignored(
    tmp_path: Path,
):
    """The GPU reset's twin of the fabric restart case (tests/test_fabric_rung.py): node1
    returned by an admin while its reset was out; the agent's refusal afterwards drained and
    rebooted a node in service."""
    c = Cluster(tmp_path)
    row = _reset_ordered(c)
    c.store.record_action(
        ActionKind.RESUME, node="node1", reason="by hand", rule=Rule.MANUAL, requested_by="admin"
    )
    c.tick()
    assert not c.ledger("node1")[0].open and not c.slurm.node("node1").reason
    mark = len(c.slurm.calls)
    refused = {"order": row.evidence["order_id"], "ok": False, "refused": True, "message": "no"}
    c.report("node1", gpu_reset=refused)
    for _ in range(3):
        c.tick()
    assert c.calls_after(mark, "node1") == [] and not c.slurm.node("node1").reason
    c.close()


def test_a_drain_held_while_a_node_validates_runs_the_tick_after_it_returns(tmp_path: Path):
    """A drain the admission step held was asked again only every 30 s: the room a returning
    node made went unused for up to 30 s (the DCGM e2e test timed out waiting for it under
    load) and the admission_held page cleared on every tick in between, then fired again.
    One node of a partition at a time: node1 validates after its reboot (in its reservation,
    not drained in Slurm, still counted) and node2's drain is held, the page firing on every
    tick; node1 passes and returns: node2 is drained on the next tick, its hold written once
    though it was asked on every tick."""
    c = Cluster(tmp_path, nodes=3, blast_radius={"partition_count": 1})
    writes: list[int] = []
    update = c.store.update_action
    c.store.update_action = lambda aid, **kw: (writes.append(aid), update(aid, **kw))[1]  # type: ignore[method-assign]
    _validating(c)
    c.report("node2", sdc_mismatch())
    c.tick(1)
    [held] = [a for a in c.store.pending_actions() if a.node == "node2"]
    assert (held.outcome or "").startswith("held:"), held.outcome
    for _ in range(5):
        c.tick(1)
        assert "cluster|admission_held" in c.engine.router.firing_keys()
        assert not c.slurm.node("node2").drained_or_draining
    assert writes.count(held.id) == 1, writes
    c.slurm.verdict("node1")
    ticks = 0
    while not c.slurm.node("node2").drained_or_draining and ticks < 10:
        c.tick(1)
        ticks += 1
    assert c.ledger("node1")[0].state is Phase.PASSED
    assert not c.slurm.node("node1").drained_or_draining
    assert c.slurm.node("node2").drained_or_draining
    # the verdict's tick, node1's return, then node2's drain: not 30 ticks of 1 s later
    assert ticks <= 3, ticks
    c.close()


def test_a_drain_is_dated_when_it_was_made_by_whoever_made_it(tmp_path: Path):
    """The verdict writer took a drain babysitter carried out in the same tick for someone
    else's (its facts predate the drain) and dated it again with the wall clock. A drain
    babysitter makes keeps the time it made it (the tick's); one an admin makes in Slurm is
    dated when babysitter first sees it."""
    c = Cluster(tmp_path, nodes=3)
    c.now += timedelta(hours=1)  # the tick's clock, an hour ahead of the wall clock
    c.tick()
    c.report("node1", sdc_mismatch())
    c.tick()
    assert c.slurm.node("node1").drained_or_draining
    assert c.store.node("node1")["drained_at"] == c.now
    c.slurm.admin_drain("node2", "cable work")
    c.tick()
    at = c.store.node("node2")["drained_at"]
    assert at is not None and at < c.now - timedelta(minutes=30)  # the wall clock's
    c.close()


def test_one_xid_the_agent_repeats_until_the_reboot_is_no_repeated_xid_page(tmp_path: Path):
    """An XID 79 the agent keeps in every report until the node reboots (a sticky event
    finding, 30 s apart) paged `xid_79_repeated`, "needs hardware inspection", from its fifth
    report on: for one event, on every node whose reboot took longer than two minutes."""
    c = Cluster(tmp_path, nodes=3)
    c.tick()
    once = xid79()
    for _ in range(10):
        c.report("node1", once)
        c.tick(30)
    keys = c.engine.router.firing_keys()
    assert "node1|node_unhealthy" in keys and "node1|xid_79_repeated" not in keys, keys
    c.close()
