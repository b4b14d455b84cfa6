"""A devcluster with 10,000 slurmd-less nodes comes up (real slurmctld, Slurm 22.05 here), and
a batched drain of several of them through the cli backend is one lookup and one update RPC
for slurmctld (its own counters, `sdiag`), with babysitter's reason and ownership rules."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.devcluster import ClusterInfo, DevCluster
from babysitter.slurm.cli import CliSlurmClient
from babysitter.slurm.client import SlurmNotOwned
from tests.fixtures.slurm import slurm

N = 10_000


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, slurm_daemons: str) -> Iterator[ClusterInfo]:
    """Brought up the way a user does: `babysitter devcluster up --extra-nodes N`."""
    base = tmp_path_factory.mktemp("big")
    cli = [sys.executable, "-m", "babysitter.cli.main", "devcluster"]
    try:
        r = subprocess.run(
            [*cli, "up", "--nodes", "2", "--extra-nodes", str(N), "--base", str(base), "--json"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["extra_nodes"] == N
        yield DevCluster(base).load_info()
    finally:
        subprocess.run([*cli, "down", "--base", str(base)], timeout=120, check=False)


def rpc_counts(info: ClusterInfo) -> dict[str, int]:
    out = slurm(info, "sdiag").stdout
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^\s+(REQUEST_\w+)\s+\(\s*\d+\)\s+count:(\d+)", out, re.M)
    }


def sinfo_reasons(info: ClusterInfo) -> dict[str, str]:
    out = slurm(info, "sinfo", "-h", "-R", "-N", "-o", "%N|%E").stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def test_big_devcluster_batched_drain_through_cli(big: ClusterInfo) -> None:
    assert len(big.fake_nodes) == N
    summary = slurm(big, "sinfo", "-h", "-o", "%D %t").stdout.split()
    assert summary.count(str(N)) == 1 and "idle*" in summary  # all fake nodes idle, no slurmd
    client = CliSlurmClient(slurm_conf=Path(big.slurm_conf))
    assert len(client.nodes()) == N + 2
    rack = big.fake_nodes[4999:5005]
    slurm(big, "scontrol", "update", f"NodeName={rack[0]}", "State=DRAIN", "Reason=admin: psu")
    slurm(big, "sdiag", "--reset")
    res = client.drain_many(rack, "gpu.memory: rack 7 ECC")
    counts = rpc_counts(big)
    assert isinstance(res[rack[0]], SlurmNotOwned)
    assert all(res[n] is None for n in rack[1:])
    # slurmctld saw one node lookup for the ownership check and one update for the batch
    assert counts.get("REQUEST_UPDATE_NODE") == 1 and counts.get("REQUEST_NODE_INFO") == 1
    reasons = sinfo_reasons(big)
    assert reasons[rack[0]] == "admin: psu"
    assert all(reasons[n] == "babysitter: gpu.memory: rack 7 ECC" for n in rack[1:])
    res = client.resume_many(rack)
    assert isinstance(res[rack[0]], SlurmNotOwned) and all(res[n] is None for n in rack[1:])
    assert set(sinfo_reasons(big)) == {rack[0]}


def test_big_devcluster_batched_drain_through_rest(big: ClusterInfo) -> None:
    """22.05's slurmrestd has no node update: the rest backend drains through scontrol, in
    one update for the batch and one small lookup, not one per node nor a full REST listing."""
    from babysitter.slurm.rest import RestSlurmClient

    client = RestSlurmClient(f"unix://{big.restd_socket}", slurm_conf=Path(big.slurm_conf))
    assert not client.has_node_update
    rack = big.fake_nodes[6999:7005]
    slurm(big, "sdiag", "--reset")
    res = client.drain_many(rack, "gpu.memory: rack 8 ECC")
    counts = rpc_counts(big)
    assert all(res[n] is None for n in rack)
    assert counts.get("REQUEST_UPDATE_NODE") == 1 and counts.get("REQUEST_NODE_INFO") == 1
    assert all(sinfo_reasons(big)[n] == "babysitter: gpu.memory: rack 8 ECC" for n in rack)
    slurm(big, "sdiag", "--reset")
    res = client.resume_many(rack)
    assert all(res[n] is None for n in rack)
    assert rpc_counts(big).get("REQUEST_UPDATE_NODE") == 1
    assert not set(rack) & set(sinfo_reasons(big))
