"""The Slurm contract on every tested version: the host's 22.05 and 25.11 (built from source;
all three backends in tests/test_slurm_contract.py) plus 24.11 (Debian trixie) and 26.05 (sid)
run from Debian roots, side by side. JSON shapes of each version are also checked from real
samples without daemons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.devcluster import DevCluster, roots
from babysitter.devcluster.cluster import ClusterInfo
from babysitter.devcluster.procs import alive
from babysitter.slurm import parse
from babysitter.slurm.cli import CliSlurmClient
from babysitter.slurm.client import SlurmNotOwned, SlurmRejected
from babysitter.slurm.rest import RestSlurmClient
from tests.fixtures.slurm import reset_cluster, running, slurm, submit, wait_for

VERSIONS = ["24.11", "26.05"]  # Debian roots; 25.11's cluster is tests/fixtures/slurm.py's
SAMPLES = ["22.05", "24.11", "25.11", "26.05"]
DATA = Path(__file__).parent / "data" / "slurm"


@pytest.fixture(scope="session", params=VERSIONS)
def versioned(request, tmp_path_factory, slurm_daemons) -> Iterator[tuple[DevCluster, ClusterInfo]]:
    c = DevCluster(
        tmp_path_factory.mktemp(f"slurm{request.param}"),
        nodes=4,
        slurm=request.param,
        topology_leafs=2,  # topology/tree: node[1-2] under leaf1, node[3-4] under leaf2
    )
    with running(c) as info:
        assert info.slurm_version == request.param
        yield c, info


@pytest.fixture
def vclean(versioned) -> tuple[DevCluster, ClusterInfo]:
    c, info = versioned
    reset_cluster(info)
    return c, info


def client(info: ClusterInfo) -> CliSlurmClient:
    return CliSlurmClient(slurm_conf=Path(info.slurm_conf), bin_dir=Path(info.bin or ""))


def test_drain_resume_ownership_requeue(vclean):
    _, info = vclean
    cl = client(info)
    cl.drain("node2", "x")
    n = cl.node("node2")
    assert n.drained_or_draining and n.reason == "babysitter: x"
    cl.resume("node2")
    wait_for(lambda: not cl.node("node2").drained_or_draining, 15, "resumed")
    slurm(info, "scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=admin maintenance")
    with pytest.raises(SlurmNotOwned):
        cl.resume("node3")
    with pytest.raises(SlurmNotOwned):
        cl.drain("node3", "y")
    assert cl.node("node3").reason == "admin maintenance"
    job = submit(info, "-w", "node2")
    wait_for(lambda: cl.job(job).running, 30, "running")
    cl.requeue(job, exclude=["node2"])
    wait_for(lambda: cl.job(job).pending, 30, "pending")  # not fooled by PENDING+COMPLETING
    j = cl.job(job)
    assert j.restart_count == 1 and "node2" in j.excluded_nodes
    nr = submit(info, "--no-requeue")
    wait_for(lambda: cl.job(nr).running, 30, "running")
    with pytest.raises(SlurmRejected, match="disabled"):
        cl.requeue(nr)


def test_rest_backend_uses_node_update_where_the_version_has_it(vclean):
    c, info = vclean
    if not c.restd:
        # 26.05's slurmrestd will not run as root, and a non-root one refuses root's changes
        # over the local socket: the REST backend there needs JWT (not set up in tests)
        assert info.slurm_version == "26.05"
        return
    rc = RestSlurmClient(
        f"unix://{info.restd_socket}",
        slurm_conf=Path(info.slurm_conf),
        bin_dir=Path(info.bin or ""),
    )
    assert rc.has_node_update
    rc.drain("node4", "via rest")
    assert client(info).node("node4").reason == "babysitter: via rest"
    rc.resume("node4")
    wait_for(lambda: not client(info).node("node4").drained_or_draining, 15, "resumed")


def test_node_failure_is_seen(vclean):
    c, info = vclean
    cl = client(info)
    c.kill_slurmd("node4")
    try:
        wait_for(
            lambda: cl.node("node4").not_responding or cl.node("node4").down,
            40,
            "node4 not responding",
        )
    finally:
        c.start_slurmd("node4")
    wait_for(lambda: not cl.node("node4").not_responding, 40, "node4 back")


TRAIN_SH = """#!/bin/sh
# a training-like job in plain sh: on a Debian-root cluster jobs run inside the root
echo "start restart=${SLURM_RESTART_COUNT:-0} resume_env=${BABYSIT_RESUME_FROM:-}"
start=0
[ -n "${BABYSIT_RESUME_FROM:-}" ] && start=${BABYSIT_RESUME_FROM##*step}
step=$((start + 1))
while :; do
    d="$BABYSIT_CKPT/step$step"
    mkdir -p "$d"
    echo weights > "$d/shard0.bin"
    if [ "$step" -eq 4 ] && [ -z "${BABYSIT_RESUME_FROM:-}" ]; then
        echo "writing step 4"
        sleep 3600
    fi
    : > "$d/.complete"
    echo "step $step done"
    step=$((step + 1))
    sleep 0.5
done
"""


def test_babysat_job_requeued_from_checkpoint(versioned, tmp_path):
    """The end-to-end scenario on this version: SimCluster with agents, a fault, the job
    requeued from its last complete checkpoint with the plugin's BABYSIT_RESUME_FROM."""
    _, vinfo = versioned
    _babysat_requeue(tmp_path, vinfo.slurm_version, "cli")


def test_babysat_job_requeued_from_checkpoint_2511_pyslurm(pyslurm_module, tmp_path):
    """The same on 25.11 with the controller and agents on the real pyslurm backend."""
    _babysat_requeue(tmp_path, "25.11", "pyslurm")


def _babysat_requeue(tmp_path: Path, version: str, backend: str) -> None:
    from babysitter.devcluster.sim import SimCluster

    sim = SimCluster(tmp_path / "sim", n_nodes=3, slurm_version=version, slurm_backend=backend)
    sim.up()
    try:
        info = sim.info
        assert info is not None
        work = Path(info.base) / "work"  # inside the cluster dir: visible inside the root
        ckpt = work / "ckpt"
        ckpt.mkdir(parents=True)
        script = work / "train.sh"
        script.write_text(TRAIN_SH)
        script.chmod(0o755)
        out = work / "job.out"
        job = int(
            slurm(
                info,
                "sbatch",
                "--parsable",
                f"--babysit=ckpt={ckpt}",
                "--open-mode=append",
                "-o",
                str(out),
                str(script),
            ).stdout.strip()
        )
        cl = client(info)
        wait_for(lambda: out.exists() and "writing step 4" in out.read_text(), 60, "step 4")
        node = cl.job(job).nodes[0]
        # an XID event from before an agent watches NVML is not news to it: on 25.11 (no
        # chroot) the job reaches step 4 before the agents are up
        wait_for(
            lambda: len([n for n in sim.api("/api/v1/nodes") if n["verdict"] == "healthy"]) == 3,
            60,
            "3 healthy nodes",
        )
        sim.inject_xid(node, 1, 79)
        wait_for(lambda: cl.job(job).restart_count == 1, 30, "requeued")
        # the requeue comes first, then ExcNodeList (it can change only while the job is
        # pending): a read between the two shows the requeue without the exclusion yet
        wait_for(lambda: node in cl.job(job).excluded_nodes, 30, "the faulty node excluded")
        wait_for(lambda: "restart=1" in out.read_text(), 90, "restarted")
        assert f"resume_env={ckpt / 'step3'}" in out.read_text()
        wait_for(lambda: "step 4 done" in out.read_text(), 30, "continued from step 4")
    finally:
        slurm(sim.info, "scancel", "-u", "root", check=False)
        sim.down()


def test_up_json_and_down_leave_no_mount_or_process(tmp_path, slurm_daemons):
    base = tmp_path / "c26"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "babysitter.cli.main",
            "devcluster",
            "up",
            "--slurm",
            "26.05",
            "--nodes",
            "2",
            "--base",
            str(base),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["slurm_version"] == "26.05" and Path(info["bin"], "sinfo").exists()
    c = DevCluster(base)
    try:
        _job_running_at_down(c, base)
    finally:
        c.down()  # a failure above must not leave mounts or daemons behind (idempotent)


def _job_running_at_down(c: DevCluster, base: Path) -> None:
    ci = c.load_info()
    # a job still running at `down`: its slurmstepd (no env marker on 24.11+, not a child of
    # slurmd) must go too
    slurm(ci, "sbatch", "-o", "/dev/null", "--wrap", "sleep 600")
    wait_for(lambda: "R" in slurm(ci, "squeue", "-h", "-o", "%t").stdout, 30, "job running")
    pids = c.pids()
    assert any(
        "slurmstepd" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
        for p in pids
        if Path(f"/proc/{p}/cmdline").exists()
    )
    root = roots.ensure_root("26.05")
    assert any(str(base) in m for m in roots.mounts_under(root))
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "devcluster", "down", "--base", str(base)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert not any(alive(p) for p in pids)
    assert not any(str(base) in m for m in roots.mounts_under(root))


@pytest.mark.parametrize("version", [v for v in SAMPLES if v != "22.05"])
def test_json_samples_parse(version):
    nodes = parse.nodes_from_json(json.loads((DATA / version / "nodes.json").read_text()))
    by = {n.name: n for n in nodes}
    assert by["node2"].drained_or_draining and by["node2"].reason.startswith("babysitter:")
    assert by["node1"].state in ("MIXED", "ALLOCATED")
    jobs = {
        j.job_id: j
        for j in parse.jobs_from_json(json.loads((DATA / version / "jobs.json").read_text()))
    }
    requeued = jobs[1]
    assert requeued.restart_count == 1 and requeued.excluded_nodes == ("node2",)
    assert requeued.admin_comment.startswith("babysit=ckpt=")


def test_without_the_source_one_line_says_where_to_put_it(tmp_path):
    env = dict(os.environ)
    env["BABYSITTER_ROOTS_CACHE"] = str(tmp_path / "cache")  # nothing built here
    env["BABYSITTER_SLURM_SOURCE"] = str(tmp_path / "vendor")  # and no tarball
    up = ["devcluster", "up", "--slurm", "25.11", "--base", str(tmp_path / "c")]
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", *up],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "put slurm-25.11.7.tar.gz" in r.stderr and str(tmp_path / "vendor") in r.stderr
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_2511_up_json_and_down_leave_no_process(tmp_path, slurm2511_prefix):
    """25.11 runs in place (no chroot): `down` must find its job steps too (slurmstepd clears
    its env and runs in the slurmd log dir) and remove slurmrestd's socket dir."""
    base = tmp_path / "c25"
    up = ["devcluster", "up", "--slurm", "25.11", "--nodes", "2", "--base", str(base), "--json"]
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", *up],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["slurm_version"] == "25.11" and Path(info["bin"], "sinfo").exists()
    c = DevCluster(base)
    try:
        ci = c.load_info()
        slurm(ci, "sbatch", "-o", "/dev/null", "--wrap", "sleep 600")
        wait_for(lambda: "R" in slurm(ci, "squeue", "-h", "-o", "%t").stdout, 30, "job running")
        pids = c.pids()
        assert any(
            "slurmstepd" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
            for p in pids
            if Path(f"/proc/{p}/cmdline").exists()
        )
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "babysitter.cli.main",
                "devcluster",
                "down",
                "--base",
                str(base),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert not any(alive(p) for p in pids)
        assert not Path(info["restd_socket"]).parent.exists()
    finally:
        c.down()


def test_topology_is_read_from_scontrol(versioned):
    """`scontrol show topology` of this version places every node under its leaf and the
    spine (controller/loop/decide/fabric.py correlates by it)."""
    _, info = versioned
    t = client(info).topology()
    assert t.kind == "tree" and not t.skipped
    assert [t.chain(n) for n in info.nodes] == [("leaf1", "spine")] * 2 + [("leaf2", "spine")] * 2
