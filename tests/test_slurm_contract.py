"""The Slurm client contract, against a real Slurm (devcluster), for each backend: the host's
22.05 through cli and rest, and Slurm 25.11 (built from source) through cli, rest and the real
pyslurm, all three against the same 25.11 cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from babysitter.devcluster import ClusterInfo
from babysitter.slurm.client import SlurmClient, SlurmNotFound, SlurmNotOwned, SlurmRejected
from tests.fixtures.slurm import (
    make_backend_for,
    node_state,
    reset_cluster,
    slurm,
    submit,
    wait_for,
)

# (the cluster fixture, the backend): the parameter names the fixture, so each target's tests
# join that cluster's group and tier (tests/conftest.py) without starting the other cluster
TARGETS = [
    ("devcluster", "cli"),
    ("devcluster", "rest"),
    ("devcluster2511", "cli"),
    ("devcluster2511", "rest"),
    ("devcluster2511_pyslurm", "pyslurm"),
]
IDS = [f"{'host' if f == 'devcluster' else '25.11'}-{b}" for f, b in TARGETS]


@pytest.fixture(params=TARGETS, ids=IDS)
def contract(request: pytest.FixtureRequest) -> Iterator[tuple[SlurmClient, ClusterInfo]]:
    """(client, cluster) with idle nodes and no jobs."""
    cluster_fixture, backend = request.param
    info = request.getfixturevalue(cluster_fixture)
    reset_cluster(info)
    yield make_backend_for(backend, info), info
    if cluster_fixture == "devcluster":  # other tests use the host's cluster as they find it
        reset_cluster(info)


@pytest.fixture
def slurm_client(contract: tuple[SlurmClient, ClusterInfo]) -> SlurmClient:
    return contract[0]


@pytest.fixture
def clean_cluster(contract: tuple[SlurmClient, ClusterInfo]) -> ClusterInfo:
    return contract[1]


def test_nodes_are_listed_with_gres_and_partition(slurm_client: SlurmClient, clean_cluster):
    nodes = {n.name: n for n in slurm_client.nodes()}
    assert set(nodes) == set(clean_cluster.nodes)
    n1 = nodes["node1"]
    assert n1.state == "IDLE"
    assert "gpu:8" in n1.gres
    assert n1.partitions == ("gpu",)


def test_drain_then_resume(slurm_client: SlurmClient, clean_cluster):
    slurm_client.drain("node2", "x")
    state, reason = node_state(clean_cluster, "node2")
    assert state in ("drain", "drng")
    assert reason == "babysitter: x"
    n = slurm_client.node("node2")
    assert n.drained_or_draining and n.reason == "babysitter: x"

    slurm_client.resume("node2")
    wait_for(lambda: node_state(clean_cluster, "node2")[0] == "idle", 15, "node2 idle")
    assert not slurm_client.node("node2").drained_or_draining


def test_admin_drain_is_never_resumed_or_overwritten(slurm_client, clean_cluster):
    slurm(
        clean_cluster,
        "scontrol",
        "update",
        "NodeName=node3",
        "State=DRAIN",
        "Reason=admin maintenance",
    )
    with pytest.raises(SlurmNotOwned, match="admin maintenance"):
        slurm_client.resume("node3")
    with pytest.raises(SlurmNotOwned):
        slurm_client.drain("node3", "gpu.ecc: DBE")
    state, reason = node_state(clean_cluster, "node3")
    assert state == "drain" and reason == "admin maintenance"


def test_requeue_with_exclude(slurm_client: SlurmClient, clean_cluster):
    job = submit(clean_cluster, "-w", "node2")
    wait_for(lambda: slurm_client.job(job).running, 20, "job running")
    assert slurm_client.job(job).nodes == ("node2",)

    slurm_client.requeue(job, exclude=["node2"])
    # COMPLETING on the old node first; "requeued" means PENDING with the restart count +1
    wait_for(lambda: slurm_client.job(job).pending, 20, "job pending")
    j = slurm_client.job(job)
    assert j.restart_count == 1
    assert "node2" in j.excluded_nodes


def test_requeue_of_a_no_requeue_job_is_a_clear_error(slurm_client, clean_cluster):
    job = submit(clean_cluster, "--no-requeue")
    wait_for(lambda: slurm_client.job(job).running, 20, "job running")
    with pytest.raises(SlurmRejected, match="disabled"):
        slurm_client.requeue(job)


def test_cancel_job_ends_that_job_and_again_is_no_error(slurm_client, clean_cluster):
    """babysitter's own validation job is cancelled on a takeover or a missing verdict
    (issue 42): scancel for every backend; a job that ended already is nothing to cancel."""
    job = submit(clean_cluster, "-w", "node2")
    other = submit(clean_cluster, "-w", "node3")
    wait_for(lambda: slurm_client.job(job).running, 20, "job running")
    slurm_client.cancel_job(job)
    wait_for(lambda: "CANCELLED" in slurm_client.job(job).states, 20, "job cancelled")
    slurm_client.cancel_job(job)
    assert not slurm_client.job(other).state.startswith("CANCELLED")  # that job only


def test_unknown_node_and_job(slurm_client: SlurmClient, clean_cluster):
    with pytest.raises(SlurmNotFound):
        slurm_client.node("node99")
    with pytest.raises(SlurmNotFound):
        slurm_client.job(999999)


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
@pytest.mark.parametrize("bad", ["node1; rm -rf /", "", "-all", "node\n1", "a" * 100])
def test_garbage_node_names_are_rejected_before_slurm(request, target, bad):
    cluster_fixture, backend = target  # no cluster reset needed: nothing reaches Slurm
    info = request.getfixturevalue(cluster_fixture)
    with pytest.raises(SlurmRejected):
        make_backend_for(backend, info).drain(bad, "x")


def test_reason_is_one_line_and_bounded(slurm_client: SlurmClient, clean_cluster):
    slurm_client.drain("node4", "line one\nline two\t" + "y" * 400)
    reason = slurm_client.node("node4").reason
    assert reason.startswith("babysitter: line one line two")
    assert "\n" not in reason and len(reason) <= 200


def test_hold_and_release(slurm_client: SlurmClient, clean_cluster):
    job = submit(clean_cluster, "--begin=now+3600")  # stays pending
    slurm_client.hold(job)
    assert slurm_client.job(job).state_reason == "JobHeldAdmin"
    slurm_client.release(job)
    wait_for(lambda: slurm_client.job(job).state_reason != "JobHeldAdmin", 10, "released")
    assert slurm_client.job(job).pending


def test_node_failure_is_seen_by_every_backend_on_2511(devcluster2511_obj, pyslurm_module):
    """One dead slurmd, seen through cli, rest and pyslurm alike (one kill: Slurm's timers,
    not the backends, set how long this takes)."""
    c = devcluster2511_obj
    info = c.info
    reset_cluster(info)
    clients = [make_backend_for(b, info) for b in ("cli", "rest", "pyslurm")]
    c.kill_slurmd("node4")
    try:
        wait_for(
            lambda: all(cl.node("node4").not_responding or cl.node("node4").down for cl in clients),
            40,
            "node4 not responding through every backend",
        )
    finally:
        c.start_slurmd("node4")
    wait_for(lambda: not any(cl.node("node4").not_responding for cl in clients), 40, "node4 back")
    reset_cluster(info)
