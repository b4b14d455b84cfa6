"""After a GPU reset or a fabric service restart the agent answers in an *event* report, which
the controller merges into the node's open findings: the fault the rung was for stays open
until the agent's next *full* report. The node must not be validated, resumed and drained
again on that stale fault (a second reset, one more toward the lemon limit): the healer waits
for a full report sent after the answer (controller/loop/heal/after_rung.py). Through the real
engine and ingest over the in-memory Slurm (tests/fixtures/healing.py)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.read.ledger import Phase
from babysitter.finding import Finding, Severity
from babysitter.report import Report
from tests.fixtures.healing import Cluster, xid48


def event(c: Cluster, node: str, *findings: Finding, **metrics: Any) -> None:
    """What the agent sends with its answer: an event report (merged, not replacing)."""
    report = Report(
        node=node,
        report_id=str(uuid.uuid4()),
        sent_at=c.now,
        findings=list(findings),
        metrics={"boot_id": c.boot[node], **metrics},
        kind="event",
    )
    ReportWriter(c.store).write([report])


def reset_done(c: Cluster, order: str) -> Finding:
    return Finding(
        check="gpu.reset",
        component="gpu3",
        severity=Severity.INFO,
        code="gpu.reset.done",
        message="GPU 3 reset",
        details={"order": order},
    )


def _reset_answered_in_an_event(c: Cluster) -> tuple[str, Finding]:
    """XID 48 on node1, the reset ordered, the agent's answer in an event report; the XID is
    still among node1's open findings. Returns the order id and the XID."""
    c.tick()
    fault = xid48()
    c.report("node1", fault)
    for _ in range(2):
        c.tick()
    (row,) = c.ledger("node1")
    assert row.state is Phase.RESETTING
    oid = row.evidence["order_id"]
    done = {"order": oid, "ok": True, "message": "GPU 3 reset"}
    c.tick()
    event(c, "node1", reset_done(c, oid), gpu_reset=done)
    codes = [f.code for f in (c.store.node("node1") or {})["open_findings"]]
    assert "xid.48" in codes  # the event report kept the fault from before the reset
    c.tick()  # the answer seen: the reset is done
    (row,) = c.ledger("node1")
    assert row.state is Phase.RESETTING and "reset_done_at" in row.evidence
    return oid, fault


def _resets(c: Cluster) -> int:
    return sum(
        1
        for a in c.store.actions()
        if a.kind is ActionKind.RESET_GPU and (a.outcome or "").startswith("ordered")
    )


def test_a_reset_answered_in_an_event_is_not_drained_again_on_the_fault_before_it(
    tmp_path: Path,
):
    c = Cluster(tmp_path)
    oid, fault = _reset_answered_in_an_event(c)
    answer = {"order": oid, "ok": True, "message": "GPU 3 reset"}
    for _ in range(3):
        c.tick()
    # a full report built before the agent's XID check ran again: the XID from before the reset
    c.report("node1", fault, gpu_reset=answer)
    c.tick()
    (row,) = c.ledger("node1")
    # not validated while node1's findings are those from before the reset
    assert row.state is Phase.RESETTING
    assert not [a for a in c.store.actions() if a.kind is ActionKind.VALIDATE]
    assert "DRAIN" in c.slurm.node("node1").flags  # still out of service
    # the agent's next full report: the reset GPU's XID is gone
    c.report("node1", gpu_reset=answer)
    c.tick()
    (row,) = c.ledger("node1")
    assert row.state is Phase.VALIDATING
    c.slurm.verdict("node1")
    for _ in range(4):
        c.tick()
    (row,) = c.ledger("node1")
    assert row.state is Phase.PASSED
    assert "DRAIN" not in c.slurm.node("node1").flags  # back in service, and stays so
    assert _resets(c) == 1
    c.close()


def test_the_fault_seen_anew_after_the_reset_is_left_to_the_validation(tmp_path: Path):
    c = Cluster(tmp_path)
    oid, fault = _reset_answered_in_an_event(c)
    c.tick()
    again = fault.replace(observed_at=c.now)  # logged again after the reset
    c.report("node1", again, gpu_reset={"order": oid, "ok": True, "message": "GPU 3 reset"})
    c.tick()
    assert c.ledger("node1")[0].state is Phase.VALIDATING
    c.close()


def test_no_full_report_after_the_answer_fails_the_rung_never_resumes(tmp_path: Path):
    c = Cluster(tmp_path, controller={"heartbeat_timeout_s": 300})
    _reset_answered_in_an_event(c)
    c.tick(301)
    rows = c.ledger("node1")
    failed = next(r for r in rows if r.rung is Rung.RESET_GPU)
    assert failed.state is Phase.FAILED
    assert "without the xid.48 from before its answer within 300 s" in (failed.outcome or "")
    assert rows[0].rung is Rung.REBOOT  # the next rung, as after any failed reset
    assert "DRAIN" in c.slurm.node("node1").flags or c.slurm.node("node1").flags & {
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
    }
    assert not [
        a
        for a in c.store.actions()
        if a.kind is ActionKind.VALIDATE and a.status is ActionStatus.DONE
    ]
    c.close()


def test_a_restart_answered_in_an_event_waits_for_a_full_report(tmp_path: Path):
    from tests.test_fabric_rung import not_trained

    c = Cluster(tmp_path)
    c.tick()
    c.report("node1", not_trained(3))
    for _ in range(2):
        c.tick()
    (row,) = c.ledger("node1")
    assert row.rung is Rung.RESTART_FABRIC and row.state is Phase.RESETTING
    done = {"order": row.evidence["order_id"], "ok": True, "message": "restarted"}
    c.tick()
    event(c, "node1", fabric_restart=done)
    c.tick()
    assert c.ledger("node1")[0].state is Phase.RESETTING
    c.report("node1", fabric_restart=done)
    c.tick()
    assert c.ledger("node1")[0].state is Phase.VALIDATING
    c.close()
