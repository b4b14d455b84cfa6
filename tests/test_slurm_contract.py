"""The Slurm client contract, against a real Slurm (devcluster), for each backend."""

from __future__ import annotations

import pytest

from babysitter.slurm.client import SlurmClient, SlurmNotFound, SlurmNotOwned, SlurmRejected
from tests.fixtures.slurm import node_state, slurm, submit, wait_for


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


def test_unknown_node_and_job(slurm_client: SlurmClient, clean_cluster):
    with pytest.raises(SlurmNotFound):
        slurm_client.node("node99")
    with pytest.raises(SlurmNotFound):
        slurm_client.job(999999)


@pytest.mark.parametrize("bad", ["node1; rm -rf /", "", "-all", "node\n1", "a" * 100])
def test_garbage_node_names_are_rejected_before_slurm(slurm_client, bad):
    with pytest.raises(SlurmRejected):
        slurm_client.drain(bad, "x")


def test_reason_is_one_line_and_bounded(slurm_client: SlurmClient, clean_cluster):
    slurm_client.drain("node4", "line one\nline two\t" + "y" * 400)
    reason = slurm_client.node("node4").reason
    assert reason.startswith("babysitter: line one line two")
    assert "\n" not in reason and len(reason) <= 200
