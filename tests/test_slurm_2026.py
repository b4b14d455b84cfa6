"""What Slurm 25.11 added, used where the running Slurm has it, on a real 25.11 slurmctld (built
from source) with `SlurmctldParameters=enable_expedited_requeue` and babysitter's
HealthCheckProgram mode at `HealthCheckNodeState=START_ONLY`; the plain behaviour on the host's
22.05. (26.05's REBOOT_ONLY: tests/test_slurm_2605.py.)"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.devcluster import ClusterInfo, DevCluster
from babysitter.devcluster.fakenvml import FakeGpus
from babysitter.slurm.cli import CliSlurmClient
from babysitter.slurm.client import SlurmClient
from babysitter.slurm.rest import RestSlurmClient
from tests.fixtures.slurm import (
    make_backend_for,
    node_state,
    reset_cluster,
    running,
    slurm,
    submit,
    wait_for,
)

FAULT = "xid.nvml: XID 79 on GPU 3 (reboot: node fault)"

# slurmd runs the HealthCheckProgram with nothing in its environment but SLURMD_NODENAME: the
# wrapper gives `babysitter check --slurm-drain` this node's name, its fake GPUs and the
# cluster's 25.11 client commands, and logs each run (node, exit code)
HEALTHCHECK = """#!/bin/sh
export SLURM_CONF={conf}
export BABYSITTER_SLURM__SLURM_CONF={conf} BABYSITTER_SLURM__BIN_DIR={bin}
export BABYSITTER_AGENT__NODE_NAME="$SLURMD_NODENAME"
export BABYSITTER_AGENT__KMSG_PATH={hc}/kmsg
export BABYSITTER_CHECKS__HOST__CHECK_SLURMD=false BABYSITTER_CHECKS__HOST__MIN_FREE_GB=0
export FAKE_NVML_STATE={hc}/gpus-"$SLURMD_NODENAME" LD_LIBRARY_PATH={lib}
{python} -m babysitter.cli.main check --slurm-drain --only gpu >/dev/null 2>&1
rc=$?
echo "$SLURMD_NODENAME $rc" >> {hc}/runs
exit $rc
"""


def _healthcheck(base: Path, lib: Path) -> Path:
    hc = base / "hc"
    hc.mkdir(parents=True)
    (hc / "kmsg").touch()
    for n in (1, 2, 3):
        FakeGpus(hc / f"gpus-node{n}").write()  # 8 healthy H100s
    prog = hc / "babysitter-healthcheck"
    prog.write_text(
        HEALTHCHECK.format(
            conf=base / "etc" / "slurm.conf",
            bin=base / "bin",
            hc=hc,
            lib=lib,
            python=sys.executable,
        )
    )
    prog.chmod(0o755)
    return prog


@pytest.fixture(scope="module")
def c2511(
    slurm2511_prefix: Path, fakenvml_lib: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevCluster]:
    base = tmp_path_factory.mktemp("s2511x")
    prog = _healthcheck(base, fakenvml_lib)
    cluster = DevCluster(
        base,
        nodes=3,
        slurm="25.11",
        extra_conf=[
            "SlurmctldParameters=enable_expedited_requeue",
            f"HealthCheckProgram={prog}",
            # START_ONLY with an interval of 1 s: were START_ONLY ignored, it would run each second
            "HealthCheckInterval=1",
            "HealthCheckNodeState=START_ONLY",
        ],
    )
    with running(cluster):
        yield cluster


@pytest.fixture
def x2511(c2511: DevCluster) -> ClusterInfo:
    assert c2511.info is not None
    reset_cluster(c2511.info)
    return c2511.info


@pytest.fixture(params=["cli", "rest"])
def backend(request: pytest.FixtureRequest, x2511: ClusterInfo) -> SlurmClient:
    return make_backend_for(request.param, x2511)


def _fault_and_competitor(
    info: ClusterInfo, cl: SlurmClient, *flags: str
) -> tuple[int, int, str, str]:
    """A 2-node job (with `flags`) on two of the three nodes, a 2-node competitor pending
    behind it (whole nodes, as GPU jobs take them), the job's second node drained by
    babysitter for a fault. (job, competitor, faulty node, the job's other node)."""
    job = submit(info, "-N2", "--exclusive", *flags)
    wait_for(lambda: cl.job(job).running, 30, "job running")
    keep, bad = cl.job(job).nodes
    other = submit(info, "-N2", "--exclusive", "--requeue")
    wait_for(lambda: cl.job(other).state == "PENDING", 15, "competitor pending")
    cl.drain(bad, FAULT)
    return job, other, bad, keep


def test_expedited_job_requeued_off_a_faulty_node_runs_before_the_competing_job(backend, x2511):
    """--requeue=expedite on 25.11: babysitter's requeue goes through Slurm's node failure
    (the drained node set DOWN), so the job is first in the queue and its old node is kept for
    it: it runs again before the job that was waiting."""
    cl = backend
    assert cl.controller_version >= (25, 11)
    job, other, bad, keep = _fault_and_competitor(x2511, cl, "--requeue=expedite")
    cl.requeue(job, exclude=[bad])
    j = cl.job(job)
    # first in the queue and eligible at once, it may run again before ExcNodeList is set:
    # never on the faulty node either way
    assert j.restart_count == 1
    assert bad in j.excluded_nodes or (j.running and bad not in j.nodes)
    # DOWN, babysitter's reason kept; with ReturnToService=2 (the devcluster's) slurmd's next
    # registration brings it back, still drained
    n = cl.node(bad)
    assert (n.down or n.drained_or_draining) and n.reason == f"babysitter: {FAULT}"
    wait_for(lambda: cl.job(job).running, 60, "requeued job running again")
    assert keep in cl.job(job).nodes and bad not in cl.job(job).nodes
    assert cl.job(other).state == "PENDING"


def test_plain_job_requeued_off_a_faulty_node_waits_behind_the_competing_job(x2511):
    """The same without --requeue=expedite: the plain requeue (BeginTime now + the requeue
    delay), the node stays drained, and the waiting job takes the freed nodes first."""
    cl = CliSlurmClient(slurm_conf=Path(x2511.slurm_conf), bin_dir=Path(x2511.bin or ""))
    job, other, bad, _ = _fault_and_competitor(x2511, cl, "--requeue")
    cl.requeue(job, exclude=[bad])
    n = cl.node(bad)
    assert not n.down and n.drained_or_draining and n.reason == f"babysitter: {FAULT}"
    wait_for(lambda: cl.job(other).running, 60, "competitor running")
    j = cl.job(job)
    assert j.restart_count == 1 and not j.running and bad in j.excluded_nodes


def test_expedite_never_fails_a_node_another_job_still_uses(x2511):
    """A job sharing the faulty node keeps running there: babysitter does not set that node
    DOWN (which would kill or requeue the other job); the expedite job gets the plain requeue."""
    cl = CliSlurmClient(slurm_conf=Path(x2511.slurm_conf), bin_dir=Path(x2511.bin or ""))
    job = submit(x2511, "-N2", "-n2", "--requeue=expedite")
    wait_for(lambda: cl.job(job).running, 30, "job running")
    bad = cl.job(job).nodes[1]
    neighbour = submit(x2511, "-w", bad, "-n1")
    wait_for(lambda: cl.job(neighbour).running, 30, "neighbour running")
    cl.drain(bad, FAULT)
    cl.requeue(job, exclude=[bad])
    j = cl.job(job)
    # the plain requeue of a job submitted with --requeue=expedite has no requeue delay: it
    # may run again before ExcNodeList is set, never on the faulty node
    assert j.restart_count == 1
    assert bad in j.excluded_nodes or (j.running and bad not in j.nodes)
    n = cl.node(bad)
    assert not n.down and n.drained_or_draining  # drained, not failed: still in use
    assert cl.job(neighbour).running


def test_rest_uses_the_newest_api_the_25_11_slurmrestd_serves(x2511):
    """25.11's slurmrestd serves v0.0.41-v0.0.44: babysitter picks v0.0.44; it has no requeue
    endpoint (that is v0.0.45, 26.05), so the requeue goes through scontrol."""
    rc = make_backend_for("rest", x2511)
    assert isinstance(rc, RestSlurmClient)
    assert rc.api_version == "v0.0.44" and rc.has_node_update and not rc.has_requeue
    job = submit(x2511)
    wait_for(lambda: rc.job(job).running, 30, "job running")
    rc.requeue(job)
    assert rc.job(job).restart_count == 1


def test_healthcheck_program_at_start_only(c2511, x2511):
    """babysitter's HealthCheckProgram mode with HealthCheckNodeState=START_ONLY: slurmctld
    takes the value, the check ran once on each node when its slurmd started, and it runs
    again (draining a node whose GPU went bad) only when that slurmd starts again."""
    config = slurm(x2511, "scontrol", "show", "config").stdout
    assert any(
        line.split("=", 1)[1].strip() == "START_ONLY"
        for line in config.splitlines()
        if line.startswith("HealthCheckNodeState")
    )
    runs = Path(x2511.base) / "hc" / "runs"
    assert sorted(runs.read_text().split("\n")[:-1]) == ["node1 0", "node2 0", "node3 0"]
    FakeGpus(Path(x2511.base) / "hc" / "gpus-node3").set(3, dbe_volatile=1)
    c2511.kill_slurmd("node3")
    c2511.start_slurmd("node3")
    wait_for(lambda: "node3 2" in runs.read_text(), 60, "the check at node3's start")
    assert sorted(runs.read_text().split("\n")[:-1]) == ["node1 0", "node2 0", "node3 0", "node3 2"]
    state, reason = node_state(x2511, "node3")
    assert state == "drain" and reason.startswith("babysitter: [healthcheck] gpu.memory")
    FakeGpus(Path(x2511.base) / "hc" / "gpus-node3").write()  # healthy again for other tests


def test_22_05_requeues_plainly_without_error(clean_cluster):
    """The host's 22.05: no expedite (sbatch refuses `--requeue=expedite`); babysitter's
    requeue off a faulty node is the plain one and the node stays drained."""
    cl = CliSlurmClient(slurm_conf=Path(clean_cluster.slurm_conf))
    assert cl.controller_version == (22, 5)
    r = slurm(clean_cluster, "sbatch", "--requeue=expedite", "--wrap", "true", check=False)
    assert r.returncode != 0
    job = submit(clean_cluster, "-N2")
    wait_for(lambda: cl.job(job).running, 30, "job running")
    bad = cl.job(job).nodes[1]
    cl.drain(bad, FAULT)
    cl.requeue(job, exclude=[bad])
    j = cl.job(job)
    assert j.restart_count == 1 and bad in j.excluded_nodes
    n = cl.node(bad)
    assert not n.down and n.drained_or_draining
