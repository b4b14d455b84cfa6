"""`babysitter slurm …` and `babysitter devcluster …` as an admin uses them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from babysitter.devcluster import ClusterInfo, DevCluster
from babysitter.devcluster.procs import alive
from tests.fixtures.slurm import slurm, submit, wait_for


def bs(info: ClusterInfo | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = info.env() if info else dict(os.environ)
    env.pop("BABYSITTER_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_drain_resume_and_admin_drain_refused(clean_cluster):
    r = bs(clean_cluster, "slurm", "drain", "node2", "--reason", "x")
    assert r.returncode == 0, r.stderr
    out = slurm(clean_cluster, "sinfo", "-h", "-N", "-n", "node2", "-o", "%t|%E").stdout
    assert out.strip().replace("*", "") in ("drain|babysitter: x", "drng|babysitter: x")

    r = bs(clean_cluster, "slurm", "resume", "node2")
    assert r.returncode == 0, r.stderr

    slurm(
        clean_cluster,
        "scontrol",
        "update",
        "nodename=node3",
        "state=drain",
        "reason=admin maintenance",
    )
    r = bs(clean_cluster, "slurm", "resume", "node3")
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "not babysitter's" in r.stderr
    assert "Traceback" not in r.stderr
    out = slurm(clean_cluster, "sinfo", "-h", "-N", "-n", "node3", "-o", "%t|%E").stdout
    assert out.strip().replace("*", "") == "drain|admin maintenance"


def test_requeue_command_and_json_listing(clean_cluster):
    job = submit(clean_cluster)
    wait_for(
        lambda: "R" in slurm(clean_cluster, "squeue", "-h", "-j", str(job), "-o", "%t").stdout,
        20,
        "job running",
    )
    r = bs(clean_cluster, "slurm", "requeue", str(job), "--exclude", "node2")
    assert r.returncode == 0, r.stderr
    r = bs(clean_cluster, "slurm", "jobs", "--json")
    jobs = {j["job_id"]: j for j in json.loads(r.stdout)}
    assert jobs[job]["restart_count"] == 1
    assert jobs[job]["excluded_nodes"] == ["node2"]

    nr = submit(clean_cluster, "--no-requeue")
    wait_for(
        lambda: "R" in slurm(clean_cluster, "squeue", "-h", "-j", str(nr), "-o", "%t").stdout,
        20,
        "job running",
    )
    r = bs(clean_cluster, "slurm", "requeue", str(nr))
    assert r.returncode == 1
    assert "presently disabled" in r.stderr


def test_second_cluster_side_by_side_and_down_leaves_nothing(tmp_path, devcluster):
    base = tmp_path / "c2"
    r = bs(None, "devcluster", "up", "--nodes", "2", "--base", str(base), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert set(info) >= {"slurm_conf", "base", "nodes"}
    assert info["nodes"] == ["node1", "node2"]
    c2 = DevCluster(base)
    pids = c2.pids()
    assert len(pids) >= 4  # munged, slurmctld, 2 slurmd (+ slurmrestd)
    # the session cluster keeps working beside it
    assert "idle" in slurm(devcluster, "sinfo", "-h", "-o", "%t").stdout

    r = bs(None, "devcluster", "down", "--base", str(base))
    assert r.returncode == 0, r.stderr
    assert not any(alive(p) for p in pids)
    assert c2.pids() == []
    r = bs(None, "devcluster", "down", "--base", str(base))  # already down: still fine
    assert r.returncode == 0, r.stderr
