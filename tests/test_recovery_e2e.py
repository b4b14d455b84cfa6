"""Follow the driver, end to end (issue 41): a real slurmctld/slurmd devcluster, the controller,
one agent per node over the fake NVML. One cluster for every case, one node each:

- nodes 1-8: GPU 3's recovery action (NVML field 230) is 0..7: none -> nothing; GPU reset,
  drain and reset, bus reset -> the agent resets the GPU (reset_gpu rung); node and system
  reboot -> `scontrol reboot` through Slurm; drain P2P -> drained, the reason naming it, no
  reset or reboot; recover IMEX domain -> drained naming it, the restart_fabric rung asks the
  agent to restart nvidia-imex, which refuses (this H100 profile runs no IMEX), and the ladder
  goes on to a reboot;
- node 9: XID 154 in the kernel log, "... to 0x2 (Node Reboot Required)" -> reboot via Slurm;
- node 10: NVLink XID 74 (NVIDIA's catalog: reset the GPU), as an NVML event and in the kernel
  log -> the reset rung, once.

Every remediated node passes its validation job and comes back into service."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.devcluster.sim import SimCluster, sim_validation
from babysitter.hardware.recovery import RecoveryAction
from tests.fixtures.slurm import node_state, wait_for

pytestmark = pytest.mark.slurm
BOUND_S = 400  # ten agents, three reboots and four resets on a loaded 2-core machine
GPU = 3
# the node whose GPU 3 asks for action N: node<N+1>
NODE = {a: f"node{int(a) + 1}" for a in RecoveryAction}
RESETS = (RecoveryAction.GPU_RESET, RecoveryAction.DRAIN_AND_RESET, RecoveryAction.BUS_RESET)
REBOOTS = (RecoveryAction.NODE_REBOOT, RecoveryAction.SYSTEM_REBOOT)
DRAINS = {RecoveryAction.DRAIN_P2P: "drain P2P", RecoveryAction.RECOVER_IMEX_DOMAIN: "IMEX"}
IMEX = RecoveryAction.RECOVER_IMEX_DOMAIN
XID154_NODE, XID74_NODE = "node9", "node10"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SimCluster]:
    base = tmp_path / "sim"
    s = SimCluster(
        base,
        n_nodes=10,
        reboot_hook=True,
        validation=sim_validation(base.resolve()),
        policy={"max_drained_fraction": 1.0},
        # the caps are not under test here: 7 of 10 nodes drained at once, 3 of them rebooting
        extra_config={
            "blast_radius": {f"{s}_fraction": 1.0 for s in ("switch", "partition", "cluster")},
            "remediation": {"max_concurrent_reboots": 4},
        },
    )
    s.up()
    try:
        yield s
    finally:
        s.down()


def _in_service(sim: SimCluster, node: str) -> bool:
    assert sim.info is not None
    return node_state(sim.info, node) == ("idle", "none")


def _healed(sim: SimCluster, node: str, rung: str) -> bool:
    rows = sim.api(f"/api/v1/ledger?node={node}")
    return any(r["rung"] == rung and r["state"] == "passed" for r in rows) and _in_service(
        sim, node
    )


def _wait(sim: SimCluster, cond, what: str, node: str) -> None:
    try:
        wait_for(cond, BOUND_S, what)
    except AssertionError as exc:  # say why: the node's Slurm state, ledger and actions
        assert sim.info is not None
        ledger = sim.api(f"/api/v1/ledger?node={node}")
        acts = [a for a in sim.api("/api/v1/actions") if a.get("node") == node][:12]
        raise AssertionError(
            f"{exc}\nslurm: {node_state(sim.info, node)}\nledger: {ledger}\nactions: {acts}"
        ) from None


# Ten agents, three reboots and four resets on a loaded 2-core machine: two reruns while this
# cluster's timing is what varies (a run in CI once met an XID 74 reset past its 400 s bound;
# the rebooted node Slurm would not resume yet is now held and retried, not failed).
@pytest.mark.flaky(reruns=2)
@pytest.mark.timeout(1500)
def test_each_recovery_action_takes_its_rung_through_slurm(cluster: SimCluster):
    sim = cluster
    assert sim.info is not None
    wait_for(
        lambda: [n["verdict"] for n in sim.api("/api/v1/nodes")] == ["healthy"] * 10,
        180,
        "10 healthy nodes",
    )
    for a, node in NODE.items():
        sim.nodes[node].gpus.recovery(GPU, int(a))
    sim.inject_xid(
        XID154_NODE,
        GPU,
        154,
        via="kmsg",
        text="GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
    )
    # a driver reports an XID both ways: the kernel log's must end with the reset too (it kept
    # the node going round reset -> resume -> drain)
    sim.inject_xid(XID74_NODE, GPU, 74)
    sim.inject_xid(XID74_NODE, GPU, 74, via="kmsg", text="NVLink: fatal error detected on link 2")

    # drains that name the action
    for a, words in DRAINS.items():
        node = NODE[a]
        _wait(sim, lambda n=node: node_state(sim.info, n)[0] in ("drain", "drng"), "drain", node)
        reason = node_state(sim.info, node)[1]
        assert reason.startswith("babysitter: ") and words in reason, reason
    # resets by the agent, reboots through Slurm; each validated and back in service
    for a in RESETS:
        _wait(sim, lambda n=NODE[a]: _healed(sim, n, "reset_gpu"), f"{a.name} reset", NODE[a])
    _wait(sim, lambda: _healed(sim, XID74_NODE, "reset_gpu"), "XID 74 reset", XID74_NODE)
    for node in (*(NODE[a] for a in REBOOTS), XID154_NODE, NODE[IMEX]):
        _wait(sim, lambda n=node: _healed(sim, n, "reboot"), f"{node} rebooted", node)

    resets = {NODE[a] for a in RESETS} | {XID74_NODE}
    reboots = {NODE[a] for a in REBOOTS} | {XID154_NODE, NODE[IMEX]}
    assert sim.gpu_resets == dict.fromkeys(sorted(resets), 1)
    assert sim.reboots == dict.fromkeys(sorted(reboots), 1)
    for a in RESETS:
        (row,) = sim.api(f"/api/v1/ledger?node={NODE[a]}")
        assert (row["rung"], row["fault_class"]) == ("reset_gpu", a.code)
    (row,) = sim.api(f"/api/v1/ledger?node={XID74_NODE}")
    assert (row["rung"], row["fault_class"]) == ("reset_gpu", "xid.74")
    (row,) = sim.api(f"/api/v1/ledger?node={XID154_NODE}")
    assert (row["rung"], row["fault_class"]) == ("reboot", "xid.154")
    # IMEX: the service restart came first (refused here: no IMEX in this profile), then reboot
    rows = sim.api(f"/api/v1/ledger?node={NODE[IMEX]}")
    assert [(r["rung"], r["state"]) for r in rows] == [
        ("reboot", "passed"),
        ("restart_fabric", "failed"),
    ]
    assert rows[1]["fault_class"] == IMEX.code and "nvidia-imex" in rows[1]["outcome"]
    # every automatic action went through the one admission step and the executor
    acts = sim.api("/api/v1/actions")
    assert {a["node"] for a in acts if a["kind"] == "reset_gpu"} == resets
    assert {a["node"] for a in acts if a["kind"] == "reboot"} >= reboots
    # none: nothing happened to node1; drain P2P's node is still drained, never remediated
    assert _in_service(sim, NODE[RecoveryAction.NONE])
    p2p = NODE[RecoveryAction.DRAIN_P2P]
    assert node_state(sim.info, p2p)[0] in ("drain", "drng")
    assert all(
        r["rung"] not in ("reset_gpu", "restart_fabric", "reboot")
        for r in sim.api(f"/api/v1/ledger?node={p2p}")
    )
