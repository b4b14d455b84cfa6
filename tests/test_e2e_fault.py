"""End to end on one machine: a real Slurm devcluster, the controller, one agent per node over
simulated GPUs (fake NVML through the real pynvml). A GPU fault drains the node, alerts, and
after a (simulated) reboot the node comes back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.devcluster.receiver import Receiver
from babysitter.devcluster.sim import SimCluster
from tests.fixtures.slurm import node_state, wait_for


@pytest.fixture
def sim(tmp_path: Path, receiver: Receiver, slurm_daemons: str) -> Iterator[SimCluster]:
    s = SimCluster(tmp_path / "sim", n_nodes=4, webhook_url=receiver.url + "/hook")
    s.up()
    try:
        yield s
    finally:
        s.down()


def test_xid79_drains_alerts_and_recovers(sim: SimCluster, receiver: Receiver):
    wait_for(
        lambda: len([n for n in sim.api("/api/v1/nodes") if n["verdict"] == "healthy"]) == 4,
        60,
        "4 healthy nodes",
    )
    t0 = time.monotonic()
    sim.inject_xid("node2", 3, 79)
    wait_for(lambda: node_state(sim.info, "node2")[0] in ("drain", "drng"), 30, "node2 drained")
    drained_after = time.monotonic() - t0
    _, reason = node_state(sim.info, "node2")
    assert reason.startswith("babysitter: ") and "XID 79" in reason
    wait_for(
        lambda: any(
            b.get("node") == "node2" and b["state"] == "firing" for b in receiver.bodies("/hook")
        ),
        30,
        "alert",
    )
    print(f"fault -> drain {drained_after:.2f} s")  # figures live in bench/, not asserts
    node = sim.api("/api/v1/nodes/node2")
    assert node["verdict"] == "unhealthy" and node["babysitter_drained"]
    acts = [a for a in sim.api("/api/v1/actions") if a["kind"] == "drain"]
    assert [a["node"] for a in acts] == ["node2"] and acts[0]["status"] == "done"

    sim.reboot("node2")
    wait_for(lambda: node_state(sim.info, "node2")[0] == "idle", 60, "node2 resumed")
    wait_for(
        lambda: any(
            b.get("node") == "node2" and b["state"] == "resolved" for b in receiver.bodies("/hook")
        ),
        30,
        "alert resolved",
    )
    assert all(node_state(sim.info, n)[0] == "idle" for n in ("node1", "node3", "node4"))


def test_polled_check_turning_critical_is_reported_at_once(tmp_path: Path, slurm_daemons: str):
    """GPU lost is found by a polled check (every 0.3 s here); the agent must not hold it until
    its next report, 120 s away: the node is drained within seconds."""
    sim = SimCluster(tmp_path / "sim", n_nodes=2, agent_interval_s=120, check_interval_s=0.3)
    sim.up()
    try:
        wait_for(
            lambda: [n["verdict"] for n in sim.api("/api/v1/nodes")] == ["healthy", "healthy"],
            60,
            "2 healthy nodes",
        )
        sim.nodes["node1"].gpus.lose(5)
        wait_for(lambda: node_state(sim.info, "node1")[0] in ("drain", "drng"), 20, "drained")
        _, reason = node_state(sim.info, "node1")
        assert reason.startswith("babysitter: ")
        assert node_state(sim.info, "node2")[0] == "idle"
    finally:
        sim.down()
