"""The admission step (loop/admit/admission.py): every automatic drain, reboot, reset, resume
and validation is asked right before it is carried out, against the caps counting done AND
pending work, the ownership of the node's current reason, and whether what it needs is known.
Regression tests of issue 42, each through the real engine where the bug was seen."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db import audit
from babysitter.controller.db import models as m
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import pending_drain_nodes
from babysitter.controller.loop.admit.admission import Act, Limits, Why, World, decide_admission
from babysitter.controller.loop.decide.blast import BlastSettings, Cap
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.read.ledger import Ledger
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.finding import Finding
from babysitter.report import Report
from babysitter.slurm.base import OwnedClient
from babysitter.slurm.client import SlurmNode, SlurmNotOwned
from babysitter.slurm.ownership import MANUAL_MARK
from babysitter.slurm.topology import tree
from tests.fixtures.healing import not_trained
from tests.fixtures.invariants import InvariantSlurm


def disk(node: str) -> Finding:
    return Finding(
        check="host.disk",
        component="host",
        severity="critical",
        code="disk.readonly",
        message=f"/ on {node} is read-only",
        action="drain",
    )


def port_down() -> Finding:
    return Finding(
        check="ib.ports",
        component="ib:mlx5_0/1",
        severity="critical",
        code="ib.port_down",
        message="ib:mlx5_0/1 is DOWN (physical Disabled)",
        action="drain",
    )


class Site:
    """The real engine over the in-memory Slurm of the invariants, with a clock the test moves."""

    def __init__(
        self,
        tmp_path: Path,
        partition_of: dict[str, str],
        leaves: dict[str, list[str]] | None = None,
        **sections: dict[str, Any],
    ) -> None:
        self.store = Store(f"sqlite:///{tmp_path / 'a.db'}")
        self.store.upgrade()
        self.names = sorted(partition_of)
        self.slurm = InvariantSlurm(partition_of, leaves or {"leaf0": self.names})
        cfg: dict[str, Any] = {
            "policy": {"max_drained_fraction": 1.0, "max_drains_per_hour": 1000},
            "controller": {"heartbeat_timeout_s": 10_000_000},
            "slurm": {"node_refresh_s": 0},
            "checks": {"sdc": {"enabled": False}},
            "remediation": {"enabled": False},
            "blast_radius": {"switch_fraction": 1.0, "partition_fraction": 1.0},
            "validation": {"output_dir": str(tmp_path / "validation")},
        }
        for key, value in sections.items():
            cfg[key] = {**cfg.get(key, {}), **value}
        self.cfg = parse_config(cfg)
        self.now = datetime.now(UTC)
        self.report({n: () for n in self.names})
        self.engine: RemediationEngine = make_engine(self.cfg, self.store, slurm=self.slurm)

    def report(self, of: dict[str, tuple[Finding, ...]]) -> None:
        if not of:
            return
        ReportWriter(self.store).write(
            [
                Report(node=n, report_id=str(uuid.uuid4()), sent_at=self.now, findings=list(f))
                for n, f in of.items()
            ]
        )

    def tick(self, seconds: float = 10.0) -> None:
        self.now += timedelta(seconds=seconds)
        self.engine.tick(self.now)

    def drained(self) -> list[str]:
        return sorted(n.name for n in self.slurm.nodes() if n.drained_or_draining)

    def refusals(self, rule: Why) -> float:
        return sum(
            self.engine.metrics.registry.get_sample_value(
                "babysitter_admission_refusals_total", {"rule": str(rule), "action": str(act)}
            )
            or 0.0
            for act in Act
        )

    def close(self) -> None:
        self.engine.close()
        self.store.close()


def test_forty_nodes_limit_four_two_faults_a_tick_through_a_slurmctld_outage_drain_four(
    tmp_path,
):
    """Issue 42: with a limit of 4 of 40 (max_drained_fraction 0.1), faults arriving two a
    tick while slurmctld is away for five minutes drained all 40 once it came back (the
    caps counted only done drains; the pending ones ran later without a re-check). Now the
    drains decided while it was away hold their place, and each is asked again right before
    it runs: 4 drained, the guard tripped."""
    names = {f"n{i:02d}": "gpu" for i in range(40)}
    site = Site(tmp_path, names, policy={"max_drained_fraction": 0.1})
    try:
        site.tick()
        site.slurm.unreachable = True
        faulty = iter(site.names)
        for _ in range(30):  # 5 minutes at 10 s a tick
            nxt = [next(faulty, None), next(faulty, None)]
            site.report({n: (disk(n),) for n in nxt if n is not None})
            site.tick()
        site.slurm.unreachable = False
        for _ in range(5):
            site.tick()
        assert len(site.drained()) == 4
        assert site.store.kv_get("guard_tripped") is True
    finally:
        site.close()


def test_forty_nodes_limit_four_held_by_the_admission_step_alone(tmp_path, monkeypatch):
    """The same with the decision-time guard blind to pending drains (as before): the
    execution-time admission alone keeps it at 4, the rest held pending, not failed."""
    import babysitter.controller.loop.read.facts as facts

    monkeypatch.setattr(facts.FactGatherer, "_with_pending", lambda self, d, p: d)
    names = {f"n{i:02d}": "gpu" for i in range(40)}
    site = Site(tmp_path, names, policy={"max_drained_fraction": 0.1})
    try:
        site.tick()
        site.slurm.unreachable = True
        for k in range(0, 40, 2):
            site.report({n: (disk(n),) for n in site.names[k : k + 2]})
            site.tick()
        site.slurm.unreachable = False
        for _ in range(5):
            site.tick(40)
        assert len(site.drained()) == 4
        held = [
            a
            for a in site.store.pending_actions()
            if a.kind is ActionKind.DRAIN and (a.outcome or "").startswith("held:")
        ]
        assert all(a.status is ActionStatus.PENDING for a in held)
    finally:
        site.close()


def test_a_switch_incident_drains_only_up_to_the_partition_cap(tmp_path):
    """Issue 42: a switch incident drained every node of it, counted by no cap. A spine
    incident over 6 of 8 nodes of one partition capped at half: 4 drained, the others held
    (and said so: metric by rule, one admission_held alert)."""
    names = {f"n{i}": "gpu" for i in range(1, 9)}
    leaves = {"leaf1": ["n1", "n2", "n3", "n4"], "leaf2": ["n5", "n6", "n7", "n8"]}
    site = Site(
        tmp_path,
        names,
        leaves,
        blast_radius={"partition_fraction": 0.5, "switch_fraction": 1.0},
        fabric={"hold_s": 10},
    )
    try:
        site.tick()
        site.report({n: (port_down(),) for n in ["n1", "n2", "n3", "n5", "n6", "n7"]})
        for _ in range(4):
            site.tick(20)
        drained = site.drained()
        reasons = {site.slurm.node_state(n).reason for n in drained}
        assert len(drained) == 4 and all(" switch " in r for r in reasons), reasons
        assert site.refusals(Why.CAP_PARTITION) >= 1
        assert "cluster|admission_held" in site.engine.router.firing_keys()
    finally:
        site.close()


def test_an_exception_in_the_fabric_step_leaves_the_caps_on(tmp_path, monkeypatch):
    """Issue 42: the fabric step raising turned every scoped cap off for that tick. A
    partition capped at one node, two nodes failing in the tick the correlation raises: one
    drained."""
    import babysitter.controller.loop.fabric.fabric_loop as fabric_loop

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("correlation bug")

    monkeypatch.setattr(fabric_loop, "correlate", broken)
    site = Site(
        tmp_path, {f"n{i}": "gpu" for i in range(1, 5)}, blast_radius={"partition_count": 1}
    )
    try:
        site.tick()
        site.report({"n1": (disk("n1"),), "n2": (disk("n2"),)})
        site.tick()
        site.tick()
        assert len(site.drained()) == 1
    finally:
        site.close()


def test_the_drain_budget_counts_drains_behind_five_thousand_other_actions(tmp_path):
    """Issue 42: the rate budget read only the newest 5,000 actions: 3 drains in the last
    hour (budget 3) followed by 5,000 job requeues, and the next fault was drained. Now the
    rolling hour is counted in the database."""
    site = Site(tmp_path, {f"n{i}": "gpu" for i in range(1, 5)}, policy={"max_drains_per_hour": 3})
    try:
        site.tick()
        rows: list[dict[str, Any]] = []
        done = site.now - timedelta(minutes=10)
        for n in ("n1", "n2", "n3"):
            rows.append({"kind": "drain", "node": n, "requested_by": "policy"})
        rows += [
            {"kind": "requeue", "job_id": 1000 + i, "requested_by": "policy"} for i in range(5000)
        ]
        with site.store.engine.begin() as c:
            c.execute(
                insert(m.actions),
                [
                    {
                        "node": None,
                        "job_id": None,
                        "reason": "earlier",
                        "rule": "critical_finding",
                        "status": "done",
                        "outcome": "ok",
                        "dry_run": False,
                        "attempts": 1,
                        "created_at": done,
                        "done_at": done,
                        **r,
                    }
                    for r in rows
                ],
            )
        site.report({"n4": (disk("n4"),)})
        site.tick()
        site.tick()
        assert site.drained() == []
    finally:
        site.close()


def pending_rows(store: Store, rows: list[dict[str, Any]], at: datetime) -> None:
    """Pending actions written straight into the table (thousands in one statement)."""
    with store.engine.begin() as c:
        c.execute(
            insert(m.actions),
            [
                {
                    "node": None,
                    "job_id": None,
                    "reason": "queued in the outage",
                    "rule": "critical_finding",
                    "requested_by": "policy",
                    "status": "pending",
                    "dry_run": False,
                    "attempts": 3,
                    "created_at": at,
                    "next_attempt_at": at + timedelta(days=1),
                    **r,
                }
                for r in rows
            ],
        )


def test_pending_drains_behind_a_thousand_other_pending_actions_hold_their_place(tmp_path):
    """Issue 42: the caps counted pending drains from `pending_actions()`, the newest 1,000
    pending actions only. Through a long slurmctld outage on a big fleet, 4 drains queued
    first (limit 4 of 40) and then 1,200 job requeues queued behind them: the next faults
    were drained on top of the 4. Now pending drains are counted in the database."""
    names = {f"n{i:02d}": "gpu" for i in range(40)}
    site = Site(tmp_path, names, policy={"max_drained_fraction": 0.1})
    try:
        site.tick()
        first = site.names[:4]  # queued first in the outage (not due before the test ends)
        pending_rows(site.store, [{"kind": "drain", "node": n} for n in first], site.now)
        pending_rows(
            site.store,
            [{"kind": "requeue", "job_id": 5000 + i, "rule": "manual"} for i in range(1200)],
            site.now,
        )
        site.report({n: (disk(n),) for n in site.names[10:16]})
        for _ in range(3):
            site.tick(40)
        assert site.drained() == []  # the 4 queued drains fill the cap; nothing on top
        assert pending_drain_nodes(site.store) == set(first)
    finally:
        site.close()


def test_a_held_drain_whose_fault_cleared_meanwhile_is_skipped_not_run(tmp_path, monkeypatch):
    """Issue 42: a drain held by the admission step ran once there was room, though the
    node's fault had cleared meanwhile (drained on stale evidence). Limit 1 of 4: n1 drained,
    n2's drain held; both report clean; n1 returns to service, which makes room: n2's held
    drain is skipped, `fault cleared while held` (and audited), and n2 is never drained."""
    import babysitter.controller.loop.read.facts as facts

    # the decision-time guard blind to pending drains: both drains decided, one held
    monkeypatch.setattr(facts.FactGatherer, "_with_pending", lambda self, d, p: d)
    site = Site(
        tmp_path,
        {f"n{i}": "gpu" for i in range(1, 5)},
        policy={"max_drained_fraction": 0.25, "validate_before_resume": False},
    )
    try:
        site.tick()
        site.slurm.unreachable = True
        for n in ("n1", "n2"):
            site.report({n: (disk(n),)})
            site.tick()
        site.slurm.unreachable = False
        site.tick(40)
        assert site.drained() == ["n1"]
        [held] = [a for a in site.store.pending_actions() if a.node == "n2"]
        assert (held.outcome or "").startswith("held:")
        for _ in range(8):
            site.report({"n1": (), "n2": ()})
            site.tick(40)
        assert site.drained() == []
        assert [c for c in site.slurm.changes if c.node == "n2"] == []
        done = site.store.action(held.id)
        assert done is not None and done.status is ActionStatus.SKIPPED
        assert (done.outcome or "").startswith("fault cleared while held")
        assert any(
            e.action_id == held.id and e.result is audit.AuditResult.SKIPPED
            for e in audit.entries(site.store, node="n2")
        )
    finally:
        site.close()


def test_a_drain_queued_in_an_outage_is_skipped_when_the_fault_cleared_before_slurm_returned(
    tmp_path,
):
    """The same for a drain that waited for slurmctld: n1's fault cleared (clean reports)
    while Slurm was away; when it comes back the queued drain is skipped, n1 stays in
    service. A node whose fault is still there is drained."""
    site = Site(tmp_path, {f"n{i}": "gpu" for i in range(1, 5)})
    try:
        site.tick()
        site.slurm.unreachable = True
        site.report({"n1": (disk("n1"),), "n2": (disk("n2"),)})
        site.tick()
        site.report({"n1": ()})
        site.tick()
        site.slurm.unreachable = False
        site.tick(40)
        site.tick(40)
        assert site.drained() == ["n2"]
        [skipped] = [a for a in site.store.actions() if a.node == "n1" and a.kind == "drain"]
        assert skipped.status is ActionStatus.SKIPPED
    finally:
        site.close()


def test_an_automatic_resume_never_takes_back_an_admins_manual_drain(tmp_path):
    """Issue 42: babysitter's ownership treated `babysitter: [manual] …` (an admin's `babysitter
    drain`) as its own. A resume the policy queued (Slurm away) finds the node drained by the
    admin when it runs: held, the node stays drained; the admin's own resume still works."""
    site = Site(tmp_path, {f"n{i}": "gpu" for i in range(1, 5)})
    try:
        site.tick()
        site.slurm.admin_drain("n1", f"babysitter: {MANUAL_MARK} cable check")
        aid = site.store.record_action(
            ActionKind.RESUME, node="n1", reason="fault gone", rule=Rule.FAULT_CLEARED
        )
        site.tick()
        site.tick(60)
        assert site.slurm.node_state("n1").reason == f"babysitter: {MANUAL_MARK} cable check"
        [a] = [a for a in site.store.actions() if a.id == aid]
        assert a.status is ActionStatus.PENDING and "the admin's" in (a.outcome or "")
        assert [c for c in site.slurm.changes if c.node == "n1"] == []
        site.store.record_action(
            ActionKind.RESUME, node="n1", rule=Rule.MANUAL, requested_by="admin"
        )
        site.tick(60)
        assert not site.slurm.node_state("n1").drained_or_draining
    finally:
        site.close()


def test_a_failed_maintenance_read_admits_no_new_drain(tmp_path):
    """Unknown is not none: with the maintenance windows unreadable, the node's fault is held
    (it may be in a window an admin is working in), not drained."""
    site = Site(tmp_path, {f"n{i}": "gpu" for i in range(1, 5)})
    try:
        site.tick()

        def fail(now: datetime) -> set[str]:
            raise RuntimeError("database is locked")

        site.engine._maintenance = fail  # type: ignore[method-assign]
        site.report({"n1": (disk("n1"),)})
        site.tick()
        assert site.drained() == []
        del site.engine._maintenance
        site.tick(60)
        assert site.drained() == ["n1"]
    finally:
        site.close()


def untrained(domain: str) -> Finding:
    """An untrained NVLink fabric, naming the node's NVLink domain (as gpu.fabric does)."""
    return not_trained(2, details={"nvlink_domain": domain})


def test_a_domain_incident_over_a_node_of_an_episode_keeps_that_nodes_place(tmp_path):
    """Found by tests/test_invariants.py: n3's Fabric Manager restart was out when an admin
    resumed it (its episode still counts it in every cap), and n2 filled the partition's
    cap 2 with it. An NVLink domain incident over n1 and n3 left n3 out of the count as a
    node of its own batch: n1 took n3's place, n3 was held, and the agent's refusal that
    followed drained n3 again (its episode's place): 3 of a cap of 2. Now the admin's resume
    ends n3's episode (healer: the restart order is withdrawn), n4, held at the cap, takes
    the place n3 gave up, the d1 incident is held at the cap for n1 and n3, and n3's late
    refusal changes nothing: 2 of 2. (The pure core's `placed` rule, for nodes whose episode
    does go on, is tested below.)"""
    d1, d2 = "6f1c2a7e-0b3d-4c55-9a10-1d2e3f4a5b6c/1", "6f1c2a7e-0b3d-4c55-9a10-1d2e3f4a5b6c/2"
    site = Site(
        tmp_path,
        dict.fromkeys(["n1", "n2", "n3", "n4"], "a"),
        blast_radius={"partition_count": 2, "domain_fraction": 1.0},
        remediation={"enabled": True},
        fabric={"hold_s": 10},
    )
    try:
        site.tick()
        site.report({"n3": (untrained(d1),)})  # alone in its domain: n3's own fault
        for _ in range(2):
            site.tick()
        site.report({n: (untrained(d2),) for n in ("n2", "n4")})  # d2's incident
        for _ in range(2):
            site.tick()
        assert site.drained() == ["n2", "n3"]  # n4 held at the partition's cap
        [rem] = [r for r in Ledger(site.store).open_rows() if r.node == "n3"]  # its restart
        site.store.record_action(
            ActionKind.RESUME, node="n3", rule=Rule.MANUAL, requested_by="admin"
        )
        site.tick()
        site.report({n: (untrained(d1),) for n in ("n1", "n3")})  # d1's incident
        for _ in range(2):
            site.tick()
        refused = {"order": rem.evidence["order_id"], "ok": False, "refused": True}
        ReportWriter(site.store).write(
            [
                Report(
                    node="n3",
                    report_id=str(uuid.uuid4()),
                    sent_at=site.now,
                    findings=[untrained(d1)],
                    metrics={"fabric_restart": {**refused, "message": "1 process(es)"}},
                )
            ]
        )
        site.tick()
        assert site.drained() == ["n2", "n4"]
        assert site.refusals(Why.CAP_PARTITION) >= 1
    finally:
        site.close()


# ---- the pure core
NODES = {
    n: SlurmNode(n, "IDLE", partitions=("a" if n in ("n1", "n2") else "b",))
    for n in ("n1", "n2", "n3", "n4")
}
TOPO = tree({"leaf1": ["n1", "n3"], "leaf2": ["n2", "n4"]})


def world(**kw: Any) -> World:
    return World(**{"nodes": NODES, "held": (), "topology": TOPO, **kw})


def test_a_scope_whose_count_is_unknown_admits_nothing():
    lim = Limits(BlastSettings(switch=Cap(count=1)))
    for w, why in (
        (world(nodes=None), "slurm snapshot stale"),
        (world(topology=None), "topology unreadable"),
        (world(drains_last_hour=None), "last hour unreadable"),
        (world(quiet=None), "maintenance windows unreadable"),
    ):
        got = decide_admission(Act.DRAIN, ["n1"], w, lim)["n1"]
        assert got is not None and got.why is Why.UNKNOWN and why in got.reason
    assert decide_admission(Act.DRAIN, ["n1"], world(), lim)["n1"] is None


def test_a_node_whose_nvlink_domain_is_unknown_is_held_as_scope_unknown():
    """Issue 49, side door 5a: n3 (an agent of the previous wire version, no Slurm block)
    shares partition b with n4, whose domain is known: with a domain cap set, its drain was
    admitted outside every domain cap. Now it is held, asked again next tick, while n4 is
    admitted within its domain's cap. A partition with no NVLink domain at all (a), or a
    cluster with none, has no domain cap to ask: admitted. An incident's drain never asks
    the domain cap; nor does a re-reason of a node babysitter holds already."""
    lim = Limits(BlastSettings(domain=Cap(count=1)))
    w = world(domains={"n4": "d1"})
    got = decide_admission(Act.DRAIN, ["n1", "n3", "n4"], w, lim)
    assert got["n3"] is not None and got["n3"].why is Why.UNKNOWN
    assert str(got["n3"]) == "held: scope unknown: NVLink domain not known"
    assert got["n1"] is None and got["n4"] is None
    assert decide_admission(Act.DRAIN, ["n3"], world(), lim)["n3"] is None  # no domains
    assert decide_admission(Act.DRAIN, ["n3"], w, Limits())["n3"] is None  # no domain cap
    assert decide_admission(Act.DRAIN, ["n3"], w, lim, switch_incident=True)["n3"] is None
    ours = {**NODES, "n3": SlurmNode("n3", "IDLE", frozenset({"DRAIN"}), "babysitter: x")}
    assert (
        decide_admission(Act.DRAIN, ["n3"], world(nodes=ours, domains={"n4": "d1"}), lim)["n3"]
        is None
    )


def test_a_batch_cannot_squeeze_past_a_cap_and_pending_drains_count():
    lim = Limits(BlastSettings(partition=Cap(count=1)))
    got = decide_admission(Act.DRAIN, ["n1", "n2", "n3"], world(), lim)
    assert [n for n, r in got.items() if r is None] == ["n1", "n3"]
    assert got["n2"] is not None and got["n2"].reason == "cap partition a 1/1"
    # n2 pending ahead (Slurm has not drained it yet): n1 is held
    got = decide_admission(Act.DRAIN, ["n1"], world(held={"n2"}), lim)
    assert got["n1"] is not None and got["n1"].why is Why.CAP_PARTITION


def test_a_node_of_the_batch_whose_place_is_counted_keeps_it():
    """n2's place is its own (an episode's: it is counted whatever becomes of this drain of
    it): asked together with n1, n2 goes and n1 is held, never n1 in n2's place. A drain
    only pending has no place of its own: it is asked like any other node of the batch."""
    lim = Limits(BlastSettings(partition=Cap(count=1)))
    for incident in (True, False):
        w = world(held={"n2"}, placed={"n2"})
        got = decide_admission(Act.DRAIN, ["n1", "n2"], w, lim, switch_incident=incident)
        assert got["n2"] is None
        assert got["n1"] is not None and got["n1"].why is Why.CAP_PARTITION
    got = decide_admission(Act.DRAIN, ["n1", "n2"], world(held={"n2"}), lim)
    assert got["n1"] is None and got["n2"] is not None


def test_automatic_actions_on_an_admins_drain_are_refused_the_admins_own_are_not():
    manual = {
        **NODES,
        "n1": SlurmNode("n1", "IDLE", frozenset({"DRAIN"}), "babysitter: [manual] x"),
    }
    for act in Act:
        got = decide_admission(act, ["n1"], world(nodes=manual), Limits())["n1"]
        assert got is not None and got.why is Why.OWNERSHIP and "admin" in got.reason
    ours = {**NODES, "n1": SlurmNode("n1", "IDLE", frozenset({"DRAIN"}), "babysitter: xid 79")}
    for act in (Act.REBOOT, Act.RESET_GPU, Act.RESUME, Act.VALIDATE):
        assert decide_admission(act, ["n1"], world(nodes=ours), Limits())["n1"] is None


class _Client(OwnedClient):
    """OwnedClient over one node held in memory: what its ownership rules let through."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.node_ = SlurmNode("n1", "IDLE", frozenset({"DRAIN"}), reason)
        self.done: list[str] = []

    def nodes(self) -> list[SlurmNode]:
        return [self.node_]

    def _set_drain(self, node: str, reason: str) -> None:
        self.done.append(f"drain {reason}")

    def _set_resume(self, node: str) -> None:
        self.done.append("resume")


def test_the_slurm_client_keeps_an_admins_manual_drain_from_automation():
    c = _Client(f"babysitter: {MANUAL_MARK} cable check")
    assert isinstance(c.resume_many(["n1"])["n1"], SlurmNotOwned)
    assert isinstance(c.drain_many(["n1"], "xid 79")["n1"], SlurmNotOwned)
    with pytest.raises(SlurmNotOwned):
        c.reboot("n1", "reboot: xid 79", "DOWN")
    assert c.done == []
    assert c.drain_many(["n1"], f"{MANUAL_MARK} still cabling")["n1"] is None  # the admin's
    assert c.resume_many(["n1"], manual=True)["n1"] is None
    assert c.done == [f"drain babysitter: {MANUAL_MARK} still cabling", "resume"]


@pytest.mark.parametrize(
    ("size", "min_drainable", "fraction"),
    [(1, 1, 0.1), (7, 1, 0.1), (10, 2, 0.1), (64, 1, 0.1), (64, 8, 0.05), (100, 0, 0.25)],
)
def test_the_admission_steps_partition_cap_is_the_policys_drain_limit(
    size, min_drainable, fraction
):
    """The policy's blast-radius guard and the admission step hold a partition to the same
    number of drained nodes (one rule: a copy that drifted would let one of them drain what
    the other refuses)."""
    from babysitter.controller.loop.decide.node.drain_guard import drain_limit
    from babysitter.controller.loop.decide.node.facts_model import PolicySettings

    policy = PolicySettings(max_drained_fraction=fraction, min_drainable=min_drainable)
    limits = Limits(max_drained_fraction=fraction, min_drainable=min_drainable)
    assert limits.guard_limit(size) == drain_limit(size, policy)
    assert drain_limit(size, policy) >= min_drainable  # the first fault of a small partition
