"""One switch, one incident, against a real slurmctld with topology/tree: 8 nodes under two
leaf switches (devcluster --topology leafs=2), partitions a = node[1-4] and b = node[5-8]. The
remediation engine runs with the real Slurm client and a real store; node reports go straight
into the store (the agent's InfiniBand check on sysfs is tests/test_infiniband.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from babysitter.cli.read_cmd import guard_lines
from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db import audit
from babysitter.controller.db.store import Store
from babysitter.controller.loop.read.guard import guard_view
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.devcluster import ClusterInfo, DevCluster
from babysitter.devcluster.receiver import Receiver
from babysitter.finding import Finding
from babysitter.report import Report
from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.slurm import reset_cluster, running, slurm, submit, wait_for

LEAF1 = ["node1", "node2", "node3", "node4"]
LEAF2 = ["node5", "node6", "node7", "node8"]
XID79 = Finding(
    check="xid.kmsg",
    component="gpu3",
    severity="critical",
    code="xid.79",
    message="XID 79 on GPU 3 (reboot: node fault)",
    action="reboot",
)


def port_down(node: str) -> Finding:
    return Finding(
        check="ib.ports",
        component="ib:mlx5_0/1",
        severity="critical",
        code="ib.port_down",
        message="ib:mlx5_0/1 is DOWN (physical Disabled)",
        action="drain",
    )


def node_state(info: ClusterInfo, node: str) -> tuple[str, str]:
    """(compact state, reason) of a node, read in the `gpu` partition (every node is in two
    partitions, so sinfo lists it twice); sinfo's `none` is no reason."""
    out = slurm(info, "sinfo", "-h", "-N", "-p", "gpu", "-n", node, "-o", "%t|%E").stdout
    state, reason = out.strip().split("|", 1)
    return state.rstrip("*"), "" if reason == "none" else reason


@pytest.fixture(scope="module")
def fabric_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    cluster = DevCluster(
        tmp_path_factory.mktemp("fabric"),
        nodes=8,
        topology_leafs=2,
        extra_conf=[
            "PartitionName=a Nodes=node[1-4] State=UP",
            "PartitionName=b Nodes=node[5-8] State=UP",
        ],
    )
    with running(cluster) as info:
        yield info


@pytest.fixture
def cluster(fabric_cluster: ClusterInfo) -> Iterator[ClusterInfo]:
    """Idle nodes and no jobs before and after each test."""
    reset_cluster(fabric_cluster)
    yield fabric_cluster
    reset_cluster(fabric_cluster)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'f.db'}")
    s.upgrade()
    yield s
    s.close()


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


def engine(
    store: Store, info: ClusterInfo, receiver: Receiver, **sections: dict[str, Any]
) -> RemediationEngine:
    cfg = parse_config(
        {
            "policy": {
                "max_drained_fraction": 0.5,
                "max_drains_per_hour": 100,
                "resume_after_clean_checks": 2,
            },
            "slurm": {"slurm_conf": info.slurm_conf},
            "alerts": {"webhook_url": receiver.url + "/hook"},
            "fabric": {"hold_s": 30, **sections.get("fabric", {})},
            # uncapped unless a test caps a scope: a whole leaf here is a whole partition
            "blast_radius": {
                **dict.fromkeys(
                    ("switch_fraction", "partition_fraction", "cluster_fraction", "domain_fraction")
                ),
                **sections.get("blast_radius", {}),
            },
            **{k: v for k, v in sections.items() if k not in ("fabric", "blast_radius")},
        }
    )
    return make_engine(cfg, store, slurm=CliSlurmClient(slurm_conf=Path(info.slurm_conf)))


def tick(eng: RemediationEngine, later_s: float = 0.0) -> None:
    """One loop iteration (`later_s` into the future: the hold is waited out in policy time,
    not with a sleep), then wait for the alert sender."""
    eng.tick(datetime.now(UTC) + timedelta(seconds=later_s))
    assert eng.sender.flush()


def bodies(receiver: Receiver) -> list[tuple[str | None, str, str]]:
    return [(b["node"], b["condition"], b["state"]) for b in receiver.bodies("/hook")]


def test_ib_down_under_one_leaf_is_one_incident_and_the_nodes_return_together(
    cluster, store, receiver
):
    cl = CliSlurmClient(slurm_conf=Path(cluster.slurm_conf))
    job = submit(cluster, "-p", "a", "-N", "2", "--comment=babysit=max_requeues=3")
    wait_for(lambda: cl.job(job).running, 30, "job running")
    eng = engine(store, cluster, receiver)
    try:
        for n in cluster.nodes:
            send(store, n)
        tick(eng)
        # the ports under leaf1 go down one after the other (one report each, seconds apart)
        for n in LEAF1[:2]:
            send(store, n, port_down(n))
            tick(eng)
        # two of four reported: held for their siblings, nothing drained, nobody paged
        assert [node_state(cluster, n)[1] for n in LEAF1] == [""] * 4
        assert bodies(receiver) == []
        # ...and yet nobody reading the controller is told they are healthy
        assert [store.node(n)["verdict"] for n in LEAF1[:2]] == ["unhealthy"] * 2
        for n in LEAF1[2:]:
            send(store, n, port_down(n))
        tick(eng)
        for n in LEAF1:
            state, reason = node_state(cluster, n)
            assert state in ("drain", "drng") and reason == "babysitter: switch leaf1 suspected"
        assert [node_state(cluster, n) for n in LEAF2] == [("idle", "")] * 4
        assert [store.node(n)["verdict"] for n in LEAF1] == ["unhealthy"] * 4
        for _ in range(3):
            tick(eng)
        assert bodies(receiver) == [(None, "switch_suspected_leaf1", "firing")]
        [alert] = receiver.bodies("/hook")
        assert alert["nodes"] == LEAF1 and job in alert["details"]["jobs"]
        assert "leaf1" in alert["summary"] and str(job) in alert["summary"]
        # one drain call for the four: one action each, all settled at once by the fabric step
        drains = [a for a in store.actions() if a.kind == "drain"]
        assert sorted(a.node for a in drains) == LEAF1
        assert {(a.rule, a.requested_by, a.status) for a in drains} == {
            ("switch_suspected", "fabric", "done")
        }
        [rq] = [a for a in store.actions() if a.kind == "requeue"]
        assert rq.job_id == job and rq.node == ",".join(LEAF1)
        # requeued: once Slurm has finished the old run (COMPLETING still lists its nodes),
        # the job is pending or running outside the leaf
        wait_for(
            lambda: (
                tick(eng) is None
                and (j := cl.job(job)).restart_count == 1
                and "COMPLETING" not in j.states
            ),
            60,
            "requeued",
        )
        assert not set(cl.job(job).nodes) & set(LEAF1)
        g = guard_view(store)
        assert [i["switch"] for i in g["switch_incidents"]] == ["leaf1"]
        assert any(
            line.startswith("switch leaf1 suspected since") and "node1, node2, node3, node4" in line
            for line in guard_lines(g)
        )
        logged = [e for e in audit.entries(store) if e.kind == "drain"]
        assert sorted(e.node for e in logged) == LEAF1
        assert {(e.actor, e.rule, e.result) for e in logged} == {
            ("fabric", "switch_suspected", audit.AuditResult.DONE)
        }
        assert all(e.evidence[0]["code"] == "ib.port_down" for e in logged)

        # a controller restart in the middle: the incident is in the store, so the new one
        # still owns the four nodes and returns them together
        eng.close()
        eng = engine(store, cluster, receiver)
        tick(eng)
        assert all(node_state(cluster, n)[0] in ("drain", "drng") for n in LEAF1)

        # the switch is back: ports up on every node; the nodes return together after two
        # clean reports each, and the incident resolves
        for n in LEAF1:
            send(store, n)
        tick(eng)
        assert all(node_state(cluster, n)[0] in ("drain", "drng") for n in LEAF1)
        for n in LEAF1:
            send(store, n)
        tick(eng)
        wait_for(
            lambda: all(node_state(cluster, n)[0] in ("idle", "alloc", "mix") for n in LEAF1),
            15,
            "leaf1 nodes resumed",
        )
        resumes = [a for a in store.actions() if a.kind == "resume"]
        assert sorted(a.node for a in resumes) == LEAF1
        assert {a.rule for a in resumes} == {"switch_recovered"}
        assert bodies(receiver)[-1] == (None, "switch_suspected_leaf1", "resolved")
        assert not any(b[1] == "node_unhealthy" for b in bodies(receiver))
        assert guard_view(store)["switch_incidents"] == []
    finally:
        eng.close()


def test_ib_down_on_one_node_alone_is_an_ordinary_node_drain(cluster, store, receiver):
    eng = engine(store, cluster, receiver)
    try:
        for n in cluster.nodes:
            send(store, n)
        send(store, "node6", port_down("node6"))
        tick(eng)
        assert node_state(cluster, "node6")[0] == "idle"  # waiting for siblings
        tick(eng, later_s=31)  # past the hold: alone, so a node fault
        state, reason = node_state(cluster, "node6")
        assert state == "drain" and reason.startswith("babysitter: ib.ports: ")
        assert bodies(receiver) == [("node6", "node_unhealthy", "firing")]
        assert guard_view(store)["switch_incidents"] == []
    finally:
        eng.close()


def test_keep_in_service_alerts_once_drains_nothing_and_moves_the_jobs(cluster, store, receiver):
    cl = CliSlurmClient(slurm_conf=Path(cluster.slurm_conf))
    job = submit(cluster, "-p", "b", "-N", "2", "--comment=babysit=max_requeues=3")
    wait_for(lambda: cl.job(job).running, 30, "job running")
    eng = engine(store, cluster, receiver, fabric={"on_switch": "keep"})
    try:
        for n in cluster.nodes:
            send(store, n)
        for n in LEAF2:
            send(store, n, port_down(n))
        tick(eng)
        tick(eng, later_s=30)
        assert {node_state(cluster, n)[1] for n in cluster.nodes} == {""}  # nothing drained
        assert bodies(receiver) == [(None, "switch_suspected_leaf2", "firing")]
        assert "left 4 node(s) in service" in receiver.bodies("/hook")[0]["action_taken"]
        [rq] = [a for a in store.actions() if a.kind == "requeue"]
        assert rq.job_id == job and rq.node == ",".join(LEAF2)
    finally:
        eng.close()


def test_tripped_partition_cap_holds_its_drains_but_recovered_nodes_still_resume(
    cluster, store, receiver
):
    """[blast_radius] partition_fraction 0.25: one drained node per 4-node partition (two in
    the 8-node `gpu`). node1 (partition a) and node5 (b) are drained; node2's new fault is held
    by partition a's cap; then node1 (same partition) and node5 (other partition) recover
    and both resume while the cap is tripped."""
    eng = engine(store, cluster, receiver, blast_radius={"partition_fraction": 0.25})
    try:
        for n in cluster.nodes:
            send(store, n)
        send(store, "node1", XID79)
        send(store, "node5", XID79)
        tick(eng)
        assert node_state(cluster, "node1")[0] == node_state(cluster, "node5")[0] == "drain"
        send(store, "node2", XID79)
        tick(eng)
        tick(eng)
        assert node_state(cluster, "node2") == ("idle", "")
        caps = guard_view(store)["blast_radius"]
        assert caps["caps"] == {"partition": {"fraction": 0.25, "count": None}}
        tripped = {(t["scope"], t["name"]): t["blocked"] for t in caps["tripped"]}
        assert tripped[("partition", "a")] == ["node2"]
        assert not guard_view(store)["tripped"]  # the cluster-wide breaker is not involved
        shown = guard_lines(guard_view(store))
        assert shown[0] == "guard: armed (drains allowed)"
        assert "cap per partition (25%): TRIPPED in 1" in shown
        assert any("partition a: 1 of 4 node(s)" in line and "node2" in line for line in shown)
        [held] = [e for e in audit.entries(store, node="node2")]
        assert (held.rule, held.result) == ("blast_radius_cap", audit.AuditResult.SKIPPED)
        assert (None, "blast_radius_cap", "firing") in bodies(receiver)
        metrics = eng.metrics.registry.get_sample_value(
            "babysitter_blast_radius_tripped", {"scope": "partition", "name": "a"}
        )
        assert metrics == 1.0

        for _ in range(2):
            for n in ("node1", "node5"):
                send(store, n)
            tick(eng)
        wait_for(
            lambda: node_state(cluster, "node1")[0] == node_state(cluster, "node5")[0] == "idle",
            15,
            "node1 and node5 resumed",
        )
        # room again in partition a: node2's fault is drained now, and the cap clears
        tick(eng)
        assert node_state(cluster, "node2")[0] == "drain"
    finally:
        eng.close()


def test_whole_installation_one_leaf_losing_its_ports(tmp_path, receiver):
    """The same with everything real but the hardware: a controller process, one agent per
    node reading a simulated InfiniBand sysfs tree, slurmctld with topology/tree. The ports of
    the four nodes under leaf1 go down within a second; one alert, four drains naming the
    switch, leaf2 untouched; the ports come back and the four return together."""
    from babysitter.devcluster import simib
    from babysitter.devcluster.sim import SimCluster

    sim = SimCluster(
        tmp_path / "sim",
        n_nodes=8,
        topology_leafs=2,
        ib_ports=1,
        webhook_url=receiver.url + "/hook",
    )
    sim.up()
    try:
        assert sim.info is not None
        info = sim.info
        wait_for(
            lambda: [n["verdict"] for n in sim.api("/api/v1/nodes")] == ["healthy"] * 8,
            90,
            "8 healthy nodes",
        )
        for n in LEAF1:
            simib.set_port(sim.base / "nodes" / n / "sysfs", "mlx5_0", 1, active=False)
        wait_for(
            lambda: all(node_state(info, n)[0] in ("drain", "drng") for n in LEAF1),
            60,
            "leaf1's nodes drained",
        )
        assert {node_state(info, n)[1] for n in LEAF1} == {"babysitter: switch leaf1 suspected"}
        wait_for(lambda: bodies(receiver), 15, "the alert")
        assert [node_state(info, n) for n in LEAF2] == [("idle", "")] * 4
        assert bodies(receiver) == [(None, "switch_suspected_leaf1", "firing")]
        # what the agents read from sysfs about where their port sits comes with it
        [alert] = receiver.bodies("/hook")
        assert alert["details"]["ports"] == {"mlx5_0/1": 4}
        assert alert["details"]["sm_lids"] == ["0x1"]
        assert "ports: mlx5_0/1 on 4; subnet manager LID 0x1" in alert["summary"]
        [node1] = [n for n in sim.api("/api/v1/nodes") if n["name"] == "node1"]
        [down] = [f for f in node1["open_findings"] if f["code"] == "ib.port_down"]
        assert down["details"]["sm_lid"] == "0x1" and down["details"]["port_guid"].startswith("0x")

        for n in LEAF1:
            simib.set_port(sim.base / "nodes" / n / "sysfs", "mlx5_0", 1, active=True)
        wait_for(lambda: all(node_state(info, n)[0] == "idle" for n in LEAF1), 90, "leaf1 back")
        wait_for(lambda: bodies(receiver)[-1][2] == "resolved", 15, "alert resolved")
        assert bodies(receiver) == [
            (None, "switch_suspected_leaf1", "firing"),
            (None, "switch_suspected_leaf1", "resolved"),
        ]
        resumes = [a for a in sim.api("/api/v1/actions") if a["kind"] == "resume"]
        assert sorted(a["node"] for a in resumes) == LEAF1
        assert {a["rule"] for a in resumes} == {"switch_recovered"}
    finally:
        sim.down()


def test_a_failing_correlation_leaves_node_faults_to_the_node_policy(
    cluster, store, receiver, monkeypatch
):
    """Fault isolation: when the fabric step raises, the tick goes on as if there were no
    correlation (an IB fault is a node fault again), and the error is counted."""
    import babysitter.controller.loop.fabric.fabric_loop as fabric_loop

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("correlation bug")

    monkeypatch.setattr(fabric_loop, "correlate", broken)
    eng = engine(store, cluster, receiver)
    try:
        for n in cluster.nodes:
            send(store, n)
        send(store, "node3", port_down("node3"))
        tick(eng)
        state, reason = node_state(cluster, "node3")
        assert state == "drain" and reason.startswith("babysitter: ib.ports: ")
        errors = eng.metrics.registry.get_sample_value(
            "babysitter_loop_item_errors_total", {"item": "fabric"}
        )
        assert errors is not None and errors >= 1
    finally:
        eng.close()


def test_a_fault_of_its_own_on_a_node_under_a_suspected_switch_stays_a_node_fault(
    cluster, store, receiver
):
    """leaf2 fails; node6 also has a GPU fault. node6's own fault pages for node6; when the
    switch is back, node5/7/8 return together without waiting for node6, which stays drained
    until its own fault clears and then returns on its own."""
    eng = engine(store, cluster, receiver)
    try:
        for n in cluster.nodes:
            send(store, n)
        for n in LEAF2:
            send(store, n, port_down(n))
        tick(eng)
        assert {node_state(cluster, n)[1] for n in LEAF2} == {"babysitter: switch leaf2 suspected"}
        send(store, "node6", port_down("node6"), XID79)
        tick(eng)
        assert (
            "node6",
            "node_unhealthy",
            "firing",
        ) in bodies(receiver)  # its own fault: its own page
        assert store.node("node6")["verdict"] == "unhealthy"
        for _ in range(2):
            for n in ("node5", "node7", "node8"):
                send(store, n)
            send(store, "node6", XID79)  # ports back, the GPU fault stays
            tick(eng)
        wait_for(
            lambda: (
                [node_state(cluster, n)[0] for n in ("node5", "node7", "node8")] == ["idle"] * 3
            ),
            15,
            "node5, node7, node8 resumed",
        )
        assert node_state(cluster, "node6")[0] == "drain"
        assert (None, "switch_suspected_leaf2", "resolved") in bodies(receiver)
        for _ in range(2):
            send(store, "node6")
            tick(eng)
        wait_for(lambda: node_state(cluster, "node6")[0] == "idle", 15, "node6 resumed")
        [own] = [a for a in store.actions() if a.kind == "resume" and a.node == "node6"]
        assert own.rule == "fault_cleared"
    finally:
        eng.close()


def _held_requeue_started(cluster, store, receiver, cl):
    """A babysat job on partition b; its node's port goes down: drained (after the fabric
    hold, alone under its leaf), and the job's requeue held for the link grace. Returns the
    engine, the job, its node."""
    job = submit(cluster, "-p", "b", "--comment=babysit=max_requeues=3")
    wait_for(lambda: cl.job(job).running, 30, "job running")
    node = cl.job(job).nodes[0]
    eng = engine(store, cluster, receiver)
    for n in cluster.nodes:
        send(store, n)
    send(store, node, port_down(node))
    tick(eng)
    tick(eng, later_s=31)  # past the fabric hold: alone, so a node fault, drained
    assert node_state(cluster, node)[0] in ("drain", "drng")
    tick(eng, later_s=32)  # the drain's follow-up: the requeue is held, not executed
    [held] = [a for a in store.pending_actions() if a.kind == "requeue"]
    assert (held.job_id, held.node, held.rule) == (job, node, "job_link_grace")
    assert "held until" in (held.outcome or "")
    [follow_up] = [a for a in store.actions() if a.kind == "requeue_jobs"]
    assert f"held the requeue of babysat job(s) {job}" in (follow_up.outcome or "")
    tick(eng, later_s=40)  # still within the grace, still down: still held
    assert cl.job(job).running and cl.job(job).restart_count == 0
    assert [a.id for a in store.pending_actions() if a.kind == "requeue"] == [held.id]
    return eng, job, node


def test_ib_port_flap_within_the_link_grace_never_touches_the_babysat_job(cluster, store, receiver):
    """Drain fast, requeue on evidence: the port is back 10 s into the 30 s grace, the node
    resumes by the clean-report rule and the job (same id) runs on, never requeued."""
    cl = CliSlurmClient(slurm_conf=Path(cluster.slurm_conf))
    eng, job, node = _held_requeue_started(cluster, store, receiver, cl)
    try:
        for _ in range(2):  # the port is back: two clean reports resume the node
            send(store, node)
            tick(eng, later_s=41)
        wait_for(lambda: node_state(cluster, node)[0] in ("alloc", "mix"), 15, "node resumed")
        tick(eng, later_s=45)  # the held requeue looks again: released
        [rq] = [a for a in store.actions() if a.kind == "requeue"]
        assert rq.status == "skipped" and "link came back within the grace" in (rq.outcome or "")
        tick(eng, later_s=80)  # long after the grace: nothing more happens to the job
        j = cl.job(job)
        assert j.running and j.restart_count == 0 and j.nodes == (node,)
        assert [a.status for a in store.actions() if a.kind == "requeue"] == ["skipped"]
        [logged] = [e for e in audit.entries(store) if e.kind == "requeue"]
        assert logged.result is audit.AuditResult.SKIPPED
        history = {r["job_id"]: r for r in store.jobs()}[job]["history"]
        assert [h["event"] for h in history] == ["requeue_held", "requeue_released"]
    finally:
        eng.close()


def test_ib_port_down_past_the_link_grace_requeues_the_job_without_the_node(
    cluster, store, receiver
):
    cl = CliSlurmClient(slurm_conf=Path(cluster.slurm_conf))
    eng, job, node = _held_requeue_started(cluster, store, receiver, cl)
    try:
        send(store, node, port_down(node))  # still down, reported fresh
        tick(eng, later_s=63)  # past the grace (30 s from the hold at +32 s)
        [rq] = [a for a in store.actions() if a.kind == "requeue"]
        assert rq.status == "done" and "link still down after the grace" in (rq.outcome or "")
        wait_for(lambda: cl.job(job).restart_count == 1, 30, "job requeued")
        assert node in cl.job(job).excluded_nodes
        assert node_state(cluster, node)[0] in ("drain", "drng")
    finally:
        eng.close()
