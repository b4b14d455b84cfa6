"""NVLink domains as a correlation scope (issue 41, deliverable 3): critical `gpu.fabric`
findings from enough nodes of one NVLink domain within the window are one
`nvlink_domain_suspected` incident, as a switch's are. The remediation engine runs with the
in-memory Slurm and a real store; node reports go straight into the store (the agent's check
itself: tests/test_gpu_fabric.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from babysitter.cli.read_cmd import guard_lines
from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.fabric import FabricSettings, correlate
from babysitter.controller.loop.fabric.nvlink_domain import (
    domain_condition,
    domain_topology,
    is_domain_fault,
    members,
    onsets,
)
from babysitter.controller.loop.read.guard import guard_view
from babysitter.controller.loop.remediation import make_engine
from babysitter.finding import Finding
from babysitter.report import Report
from babysitter.slurm.topology import Switch, Topology
from bench.slurm_standin import InMemorySlurm
from tests.fixtures.healing import not_trained as fabric_not_trained

RACK_A = "5f0c1e2a-7b3d-4c8e-9a10-1234567890ab/1"
RACK_B = "0d15ea5e-0000-4000-8000-00000000000b/1"
DOMAINS = {RACK_A: ["n1", "n2", "n3", "n4"], RACK_B: ["n5", "n6", "n7", "n8"]}
NODES = [n for ns in DOMAINS.values() for n in ns]
DOMAIN_OF = {n: d for d, ns in DOMAINS.items() for n in ns}
T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def not_trained(node: str, gpu: int = 0) -> Finding:
    return fabric_not_trained(gpu, details={"nvlink_domain": DOMAIN_OF[node], "clique_id": 1})


# ---- the policy, pure
def test_three_of_four_nodes_of_a_domain_within_10_s_are_one_incident_naming_it():
    topo = domain_topology(DOMAIN_OF)
    findings = {n: [not_trained(n)] for n in ("n1", "n2", "n3")}
    ev = {}
    for i, n in enumerate(("n1", "n2", "n3")):  # onsets spread over 10 s
        ev |= onsets({n: findings[n]}, ev, T0 + timedelta(seconds=5 * i))
    view = correlate(topo, ev, [], {}, FabricSettings(), T0 + timedelta(seconds=20))
    [inc] = view.opened
    assert inc.switch == RACK_A and inc.nodes == {"n1", "n2", "n3"}


def test_one_node_of_a_domain_is_held_then_its_own_fault():
    topo = domain_topology(DOMAIN_OF)
    ev = onsets({"n5": [not_trained("n5")]}, {}, T0)
    view = correlate(topo, ev, [], {}, FabricSettings(), T0 + timedelta(seconds=1))
    assert view.opened == () and view.held == {"n5"}
    view = correlate(topo, ev, [], {}, FabricSettings(), T0 + timedelta(seconds=11))
    assert view.opened == () and view.held == frozenset()


def test_warnings_and_job_owned_findings_are_no_domain_evidence():
    degraded = not_trained("n1").replace(severity="warning", code="fabric.degraded_bw")
    assert not is_domain_fault(degraded)
    other = not_trained("n1").replace(check="ib.ports", code="ib.port_down")
    assert not is_domain_fault(other)


def test_membership_from_reports_then_findings_then_slurm_blocks():
    blocks = Topology(
        {"rack7": Switch("rack7", 0, frozenset({"n9", "n1"}))},  # type: ignore[arg-type]
        "block",
    )
    got = members({"n1": RACK_A}, blocks, {"n2": [not_trained("n2")]})
    assert got == {"n1": RACK_A, "n2": RACK_A, "n9": "block rack7"}
    # a tree topology's leaves are switches, not NVLink domains
    assert members({}, Topology(blocks.switches, "tree"), {}) == {}


def test_a_domain_name_becomes_a_stable_alert_condition():
    assert domain_condition(RACK_A) == (
        "nvlink_domain_suspected_5f0c1e2a-7b3d-4c8e-9a10-1234567890ab_1"
    )


# ---- the engine, with the in-memory Slurm
def report(node: str, findings: list[Finding]) -> Report:
    return Report(
        node=node,
        report_id=str(uuid.uuid4()),
        sent_at=datetime.now(UTC),
        findings=findings,
        metrics={"nvlink_domain": DOMAIN_OF[node]},
    )


@pytest.fixture
def engine(tmp_path: Path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    slurm = InMemorySlurm(NODES)
    cfg = parse_config(
        {
            "policy": {"max_drained_fraction": 1.0, "max_drains_per_hour": 1000},
            "slurm": {"node_refresh_s": 0, "job_scan_s": 0},
            "blast_radius": {"partition_fraction": 1.0, "cluster_fraction": 1.0},
        }
    )
    return store, slurm, make_engine(cfg, store, slurm=slurm)


def test_three_of_four_nodes_of_one_domain_are_one_alert_and_one_batched_drain(engine):
    store, slurm, eng = engine
    ReportWriter(store).write([report(n, []) for n in NODES])
    eng.tick(T0)
    for i, n in enumerate(("n1", "n2", "n3")):  # within 10 s
        ReportWriter(store).write([report(n, [not_trained(n)])])
        eng.tick(T0 + timedelta(seconds=1 + 4 * i))
    eng.tick(T0 + timedelta(seconds=25))  # past the hold
    eng.tick(T0 + timedelta(seconds=30))
    assert eng.sender.flush()

    drains = [(op, arg) for op, arg in slurm.calls if op in ("drain", "drain_many")]
    assert len(drains) == 1 and drains[0][0] == "drain_many", slurm.calls
    drained = {n.name: n.reason for n in slurm.nodes() if n.drained_or_draining}
    assert drained == dict.fromkeys(
        ("n1", "n2", "n3"), f"babysitter: NVLink domain {RACK_A} suspected"
    )
    firing = [a for a in store.alerts() if a["state"] == "firing"]
    domain_alerts = [a for a in firing if a["condition"].startswith("nvlink_domain_suspected")]
    [alert] = domain_alerts
    assert alert["condition"] == domain_condition(RACK_A)
    assert RACK_A in alert["summary"]
    # no alert of their own for the covered nodes, the other domain untouched
    assert not [a for a in firing if a["node"] in NODES]
    assert not [n for n in drained if DOMAIN_OF[n] == RACK_B]
    acts = [a for a in store.actions() if a.kind.value == "drain"]
    assert {a.node for a in acts} == {"n1", "n2", "n3"}
    assert {str(a.rule) for a in acts} == {"nvlink_domain_suspected"}
    # `babysitter guard` (GET /api/v1/guard) lists the incident
    g = guard_view(store)
    assert [i["switch"] for i in g["nvlink_domain_incidents"]] == [RACK_A]
    assert any(
        line.startswith(f"NVLink domain {RACK_A} suspected since") and "n1, n2, n3" in line
        for line in guard_lines(g)
    )


def test_one_node_with_an_untrained_fabric_is_drained_naming_the_fabric(engine):
    store, slurm, eng = engine
    ReportWriter(store).write([report(n, []) for n in NODES])
    eng.tick(T0)
    ReportWriter(store).write([report("n6", [not_trained("n6", gpu=3)])])
    eng.tick(T0 + timedelta(seconds=1))
    assert not [n for n in slurm.nodes() if n.drained_or_draining]  # held for its siblings
    eng.tick(T0 + timedelta(seconds=15))  # past the hold: the node's own fault
    eng.tick(T0 + timedelta(seconds=16))
    drained = {n.name: n.reason for n in slurm.nodes() if n.drained_or_draining}
    assert list(drained) == ["n6"]
    assert "gpu.fabric" in drained["n6"] and "NVLink fabric NOT_STARTED" in drained["n6"]
    assert store.kv_get("nvlink_domain_incidents") in (None, [])


# ---- the domain cap (admission)
def test_a_domain_cap_holds_one_by_one_drains_but_not_the_domains_own_incident():
    from babysitter.controller.loop.admit.admission import Act, Limits, Why, World, decide_admission
    from babysitter.controller.loop.decide.blast import BlastSettings, Cap
    from babysitter.slurm.client import SlurmNode

    nodes = {n: SlurmNode(n, "IDLE", partitions=("gpu",)) for n in NODES}
    w = World(nodes=nodes, held=(), domains=DOMAIN_OF)
    lim = Limits(BlastSettings(domain=Cap(count=1)))
    got = decide_admission(Act.DRAIN, ["n1", "n2", "n5"], w, lim)
    assert got["n1"] is None and got["n5"] is None  # one per domain
    assert got["n2"] is not None and got["n2"].why is Why.CAP_DOMAIN
    assert got["n2"].reason == f"cap domain {RACK_A} 1/1"
    # the domain incident's batched drain is one fault: its own domain's cap does not hold it
    got = decide_admission(Act.DRAIN, ["n1", "n2", "n3"], w, lim, switch_incident=True)
    assert all(r is None for r in got.values())
