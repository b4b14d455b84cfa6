"""One NVLink domain, one incident, against a real slurmctld: 8 nodes in two NVLink domains
(two NVL72 racks, by the cluster UUID and clique the agents report). The remediation engine
runs with the real Slurm client and a real store; node reports go straight into the store
(the agent's check itself: tests/test_gpu_fabric.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.store import Store
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.devcluster import ClusterInfo, DevCluster
from babysitter.devcluster.receiver import Receiver
from babysitter.finding import Finding
from babysitter.report import Report
from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.healing import not_trained as fabric_not_trained
from tests.fixtures.slurm import reset_cluster, running, slurm, wait_for

RACK_A = "5f0c1e2a-7b3d-4c8e-9a10-1234567890ab/1"
RACK_B = "0d15ea5e-0000-4000-8000-00000000000b/1"
A = ["node1", "node2", "node3", "node4"]
B = ["node5", "node6", "node7", "node8"]
DOMAIN_OF = {**dict.fromkeys(A, RACK_A), **dict.fromkeys(B, RACK_B)}


def not_trained(node: str) -> Finding:
    return fabric_not_trained(0, details={"nvlink_domain": DOMAIN_OF[node], "clique_id": 1})


def node_state(info: ClusterInfo, node: str) -> tuple[str, str]:
    """(compact state, reason) of a node; sinfo's `none` is no reason."""
    out = slurm(info, "sinfo", "-h", "-N", "-n", node, "-o", "%t|%E").stdout
    state, reason = out.strip().splitlines()[0].split("|", 1)
    return state.rstrip("*"), "" if reason == "none" else reason


@pytest.fixture(scope="module")
def domain_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    with running(DevCluster(tmp_path_factory.mktemp("nvl"), nodes=8)) as info:
        yield info


@pytest.fixture
def cluster(domain_cluster: ClusterInfo) -> Iterator[ClusterInfo]:
    reset_cluster(domain_cluster)
    yield domain_cluster
    reset_cluster(domain_cluster)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'd.db'}")
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
                metrics={"nvlink_domain": DOMAIN_OF[node]},
            )
        ]
    )


def engine(store: Store, info: ClusterInfo, receiver: Receiver) -> RemediationEngine:
    cfg = parse_config(
        {
            "policy": {
                "max_drained_fraction": 0.5,
                "max_drains_per_hour": 100,
                "resume_after_clean_checks": 2,
            },
            "slurm": {"slurm_conf": info.slurm_conf, "node_refresh_s": 0},
            "alerts": {"webhook_url": receiver.url + "/hook"},
            "blast_radius": dict.fromkeys(
                ("switch_fraction", "partition_fraction", "cluster_fraction")
            ),
        }
    )
    return make_engine(cfg, store, slurm=CliSlurmClient(slurm_conf=Path(info.slurm_conf)))


def tick(eng: RemediationEngine, at: datetime) -> None:
    eng.tick(at)
    assert eng.sender.flush()


def bodies(receiver: Receiver) -> list[tuple[str | None, str, str]]:
    return [(b["node"], b["condition"], b["state"]) for b in receiver.bodies("/hook")]


def test_three_of_four_nodes_of_a_domain_are_one_alert_and_one_drain_the_other_untouched(
    cluster, store, receiver
):
    condition = "nvlink_domain_suspected_5f0c1e2a-7b3d-4c8e-9a10-1234567890ab_1"
    eng = engine(store, cluster, receiver)
    t0 = datetime.now(UTC)
    try:
        for n in cluster.nodes:
            send(store, n)
        tick(eng, t0)
        # node1..node3 lose their fabric within 10 s (policy time: the hold is not slept)
        for i, n in enumerate(A[:3]):
            send(store, n, not_trained(n))
            tick(eng, t0 + timedelta(seconds=1 + 4 * i))
        assert [node_state(cluster, n)[1] for n in A] == [""] * 4  # held for their siblings
        tick(eng, t0 + timedelta(seconds=25))  # past the hold
        reason = f"babysitter: NVLink domain {RACK_A} suspected"
        for n in A[:3]:
            state, got = node_state(cluster, n)
            assert state in ("drain", "drng") and got == reason
        assert [node_state(cluster, n) for n in [A[3], *B]] == [("idle", "")] * 5
        tick(eng, t0 + timedelta(seconds=30))
        assert bodies(receiver) == [(None, condition, "firing")]
        [alert] = receiver.bodies("/hook")
        assert alert["nodes"] == A[:3] and RACK_A in alert["summary"]
        drains = [a for a in store.actions() if a.kind == "drain"]
        assert sorted(a.node for a in drains) == A[:3]
        assert {(a.rule, a.requested_by, a.status) for a in drains} == {
            ("nvlink_domain_suspected", "fabric", "done")
        }
        # the fabric trains again: every node clean twice, resumed together, alert resolved
        for k in range(3):
            for n in A:
                send(store, n)
            tick(eng, t0 + timedelta(seconds=40 + 10 * k))
        wait_for(lambda: all(node_state(cluster, n)[0] == "idle" for n in A), 30, "domain resumed")
        resumes = [a for a in store.actions() if a.kind == "resume"]
        assert sorted(a.node for a in resumes) == A[:3]
        assert {a.rule for a in resumes} == {"nvlink_domain_recovered"}
        assert bodies(receiver)[-1] == (None, condition, "resolved")
    finally:
        eng.close()
