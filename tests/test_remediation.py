"""Remediation against a real Slurm (devcluster): the engine with the real Slurm client and a
real store; node reports are ingested straight into the store here (the agent → API path is
covered by tests/test_agent.py and tests/test_e2e_fault.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db import models
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.store import Store
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.finding import Finding
from babysitter.report import Report
from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.slurm import node_state, slurm, submit, wait_for

XID79 = Finding(
    check="xid.kmsg",
    component="gpu3",
    severity="critical",
    code="xid.79",
    message="XID 79 on GPU 3 (PCI 0000:5d:00) (reboot: node fault)",
    action="reboot",
    details={"xid": 79},
)


def send(store: Store, node: str, *findings: Finding) -> None:
    ReportWriter(store).write(
        [
            Report(
                node=node,
                report_id=str(uuid.uuid4()),
                sent_at=datetime.now(UTC),
                findings=list(findings),
                metrics={},
            )
        ]
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.upgrade()
    yield s
    s.close()


def engine(store: Store, info, receiver=None, **policy) -> RemediationEngine:
    alerts = {"webhook_url": receiver.url + "/hook"} if receiver else {}
    cfg = parse_config(
        {
            "policy": {"max_drained_fraction": 0.5, "resume_after_clean_checks": 2, **policy},
            # the breaker alone: [blast_radius] caps (tests/test_blast.py, test_admission.py)
            # at half would hold the third drain before the breaker could trip
            "blast_radius": dict.fromkeys(
                ("switch_fraction", "partition_fraction", "cluster_fraction")
            ),
            "slurm": {"slurm_conf": info.slurm_conf},
            "alerts": alerts,
        }
    )
    return make_engine(cfg, store, slurm=CliSlurmClient(slurm_conf=Path(info.slurm_conf)))


def tick(eng: RemediationEngine) -> None:
    """One loop iteration, then wait for the alert sender (it runs on its own thread)."""
    eng.tick()
    assert eng.sender.flush()


def test_fault_drains_alerts_then_resumes_after_clean_reports(clean_cluster, store, receiver):
    eng = engine(store, clean_cluster, receiver)
    for n in clean_cluster.nodes:
        send(store, n)
    send(store, "node2", XID79)
    tick(eng)
    state, reason = node_state(clean_cluster, "node2")
    assert state == "drain" and reason.startswith("babysitter: xid.kmsg: XID 79 on GPU 3")
    [fired] = receiver.bodies("/hook")
    assert fired["node"] == "node2" and fired["state"] == "firing"
    assert "drained node2" in fired["action_taken"] and fired["what_to_do"]
    tick(eng)  # nothing new: no second drain, no second alert
    drains = [a for a in store.actions() if a.kind == "drain"]
    assert len(drains) == 1 and drains[0].rule == "critical_finding"
    assert len(receiver.bodies("/hook")) == 1

    send(store, "node2")
    tick(eng)
    assert node_state(clean_cluster, "node2")[0] == "drain"  # one clean report is not enough
    send(store, "node2")
    tick(eng)
    wait_for(lambda: node_state(clean_cluster, "node2")[0] == "idle", 15, "node2 resumed")
    assert receiver.bodies("/hook")[-1]["state"] == "resolved"


def test_admin_drained_node_is_left_alone(clean_cluster, store, receiver):
    slurm(
        clean_cluster,
        "scontrol",
        "update",
        "NodeName=node3",
        "State=DRAIN",
        "Reason=admin maintenance",
    )
    eng = engine(store, clean_cluster, receiver)
    send(store, "node3", XID79)
    tick(eng)
    for _ in range(3):
        send(store, "node3")
        tick(eng)
    assert node_state(clean_cluster, "node3") == ("drain", "admin maintenance")
    assert not [a for a in store.actions() if a.node == "node3" and a.kind in ("drain", "resume")]
    assert receiver.bodies("/hook")[0]["condition"] == "node_unhealthy_not_ours"


def test_guard_three_of_four_fail(clean_cluster, store, receiver):
    eng = engine(store, clean_cluster, receiver)
    for n in ("node1", "node2", "node3"):
        send(store, n, XID79)
    send(store, "node4")
    tick(eng)
    tick(eng)
    drained = [n for n in clean_cluster.nodes if node_state(clean_cluster, n)[0] == "drain"]
    assert len(drained) == 2
    assert node_state(clean_cluster, "node4")[0] == "idle"
    guard = [b for b in receiver.bodies("/hook") if b["condition"] == "guard_tripped"]
    assert len(guard) == 1 and "NOT drained" in guard[0]["summary"]
    assert store.kv_get("guard_tripped") is True
    # an admin reset (POST /api/v1/guard/reset, `babysitter guard reset`) re-arms it
    store.record_action("guard_reset", rule="manual", requested_by="admin")
    tick(eng)
    assert store.kv_get("guard_tripped") is False
    assert [a.status for a in store.actions() if a.kind == "guard_reset"] == ["done"]


def test_dry_run_changes_nothing_in_slurm(clean_cluster, store, receiver):
    eng = engine(store, clean_cluster, receiver, dry_run=True)
    for n in ("node1", "node2", "node3"):
        send(store, n, XID79)
    tick(eng)
    tick(eng)
    assert all(node_state(clean_cluster, n)[0] == "idle" for n in clean_cluster.nodes)
    acts = [a for a in store.actions() if a.kind == "drain"]
    assert len(acts) == 2 and all(a.dry_run and a.status == "done" for a in acts)
    assert any("dry-run" in b["action_taken"] for b in receiver.bodies("/hook"))


def test_slurmctld_down_then_back_drains_exactly_once(clean_cluster, devcluster_obj, store):
    eng = engine(store, clean_cluster)
    for n in clean_cluster.nodes:
        send(store, n)
    tick(eng)  # Slurm state known
    devcluster_obj.stop_slurmctld()
    try:
        send(store, "node2", XID79)
        for _ in range(3):
            tick(eng)
        pending = [a for a in store.actions() if a.kind == "drain"]
        assert len(pending) == 1 and pending[0].status == "pending"
    finally:
        devcluster_obj.start_slurmctld()
    wait_for(
        lambda: eng.tick() is not None and node_state(clean_cluster, "node2")[0] == "drain",
        60,
        "drain after slurmctld returned",
    )
    for _ in range(3):
        tick(eng)
    drains = [a for a in store.actions() if a.kind == "drain"]
    assert len(drains) == 1 and drains[0].status == "done"


def test_requeue_waits_out_a_slurmctld_outage_and_runs_once(
    clean_cluster, devcluster_obj, store, tmp_path
):
    """The drain's follow-up is an action: the babysat job's requeue is recorded, waits while
    slurmctld is stopped (~20 s), and runs exactly once when it is back."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cl = CliSlurmClient(slurm_conf=Path(clean_cluster.slurm_conf))
    job = submit(clean_cluster, f"--comment=babysit=ckpt={ckpt}")
    wait_for(lambda: cl.job(job).running, 30, "job running")
    node = cl.job(job).nodes[0]
    eng = engine(store, clean_cluster)
    for n in clean_cluster.nodes:
        send(store, n)
    send(store, node, XID79)
    tick(eng)  # drain; the follow-up `requeue_jobs` is recorded
    tick(eng)  # the follow-up lists the node's babysat jobs: one `requeue` action
    [rq] = [a for a in store.actions() if a.kind == "requeue"]
    assert rq.status == "pending" and rq.job_id == job
    devcluster_obj.stop_slurmctld()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            tick(eng)
            time.sleep(1)
        [rq] = [a for a in store.actions() if a.kind == "requeue"]
        assert rq.status == "pending" and rq.attempts >= 1 and "wait" in rq.outcome
    finally:
        devcluster_obj.start_slurmctld()
    wait_for(
        lambda: tick(eng) is None and cl.job(job).restart_count == 1,
        60,
        "requeued after slurmctld returned",
    )
    for _ in range(3):
        tick(eng)
    [rq] = [a for a in store.actions() if a.kind == "requeue"]
    assert rq.status == "done" and cl.job(job).restart_count == 1
    [row] = [j for j in store.jobs() if j["job_id"] == job]
    assert row["requeues"] == 1
    eng.close()


def test_one_requeue_limit_alert_per_job_resolved_when_released_or_ended(
    clean_cluster, store, receiver
):
    cl = CliSlurmClient(slurm_conf=Path(clean_cluster.slurm_conf))
    jobs = [
        submit(clean_cluster, "--exclusive", "--comment=babysit=max_requeues=0") for _ in range(2)
    ]
    wait_for(lambda: all(cl.job(j).running for j in jobs), 30, "jobs running")
    eng = engine(store, clean_cluster, receiver)
    for n in clean_cluster.nodes:
        send(store, n)
    for j in jobs:
        send(store, cl.job(j).nodes[0], XID79)
    for _ in range(3):  # drains; follow-ups; the requeues (held: limit 0)
        tick(eng)

    def limit_alerts(state: str) -> set[str]:
        return {
            b["condition"]
            for b in receiver.bodies("/hook")
            if b["condition"].startswith("job_requeue_limit_") and b["state"] == state
        }

    want = {f"job_requeue_limit_{j}" for j in jobs}
    assert limit_alerts("firing") == want  # one per job, the second is not suppressed
    slurm(clean_cluster, "scancel", str(jobs[0]))
    slurm(clean_cluster, "scontrol", "release", str(jobs[1]))
    wait_for(
        lambda: tick(eng) is None and limit_alerts("resolved") == want,
        30,
        "both resolved: one ended, one released",
    )
    eng.close()


def test_job_that_requires_the_bad_node_is_not_stranded_silently(
    clean_cluster, store, receiver, tmp_path
):
    """`-w node2` and node2 breaks: excluding node2 would leave the job pending forever with
    no word. It is requeued without that exclude, and on-call is told it waits for node2."""
    cl = CliSlurmClient(slurm_conf=Path(clean_cluster.slurm_conf))
    job = submit(clean_cluster, "-w", "node2", f"--comment=babysit=ckpt={tmp_path}")
    wait_for(lambda: cl.job(job).running, 30, "job running")
    assert cl.job(job).extra["required_nodes"] == "node2"
    eng = engine(store, clean_cluster, receiver)
    for n in clean_cluster.nodes:
        send(store, n)
    send(store, "node2", XID79)
    for _ in range(3):  # drain; follow-up; requeue
        tick(eng)
    wait_for(lambda: cl.job(job).restart_count == 1, 30, "requeued")
    assert "node2" not in cl.job(job).excluded_nodes
    [a] = [b for b in receiver.bodies("/hook") if b["condition"] == f"job_unplaceable_{job}"]
    assert "requires node(s) node2" in a["summary"]
    eng.close()


def test_an_action_row_this_version_cannot_read_is_never_carried_out(clean_cluster, store):
    """Rows written by hand or by another version: a kind nobody here knows reads as
    `unknown` and its pending run fails saying why; a status nobody knows reads as failed and
    never runs. Neither drains anything."""
    eng = engine(store, clean_cluster)
    for n in clean_cluster.nodes:
        send(store, n)
    at = datetime.now(UTC)
    row = {"reason": "x", "requested_by": "admin", "attempts": 0, "dry_run": False}
    with store.engine.begin() as c:
        for kind, node, status in (("power_off", "node2", "pending"), ("drain", "node3", "new")):
            c.execute(
                models.actions.insert().values(
                    kind=kind, node=node, status=status, created_at=at, next_attempt_at=at, **row
                )
            )
    tick(eng)
    by_node = {a.node: a for a in store.actions()}
    assert by_node["node2"].kind is ActionKind.UNKNOWN
    assert by_node["node2"].status is ActionStatus.FAILED
    assert "cannot execute unknown" in str(by_node["node2"].outcome)
    assert by_node["node3"].status is ActionStatus.FAILED and by_node["node3"].attempts == 0
    assert node_state(clean_cluster, "node2")[0] == "idle"
    assert node_state(clean_cluster, "node3")[0] == "idle"
