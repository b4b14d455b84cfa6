"""Babysat jobs of real unprivileged users (useradd) through the real SPANK plugin and
job_submit.lua, with a root controller: checkpoint discovery, heartbeat reads and resume.json
writes happen as the job's owner (issue #14), and discovery picks the right step (issue #15).

The jobs run /usr/bin/python3 (the suite's interpreter lives under /root, which other users
cannot enter); babysitter.job is stdlib-only, so the system Python imports it from the tree."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from babysitter.checkpoints import owner
from babysitter.devcluster.receiver import Receiver
from babysitter.devcluster.sim import SimCluster
from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.slurm import slurm, wait_for
from tests.fixtures.users import TestUser
from tests.test_e2e_jobs import agents_reporting

REPO = Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"

TRAIN = r"""
import os, sys, time, zipfile
sys.path.insert(0, {repo!r})
from babysitter import job
ckpt = os.environ.get("BABYSIT_CKPT", "")
mode = sys.argv[1]
print("start restart=%s resume_env=[%s] helper=[%s]" % (
    os.environ.get("SLURM_RESTART_COUNT", "0"), os.environ.get("BABYSIT_RESUME_FROM", ""),
    job.resume_path()), flush=True)
if os.environ.get("SLURM_RESTART_COUNT", "0") != "0" or mode == "idle":
    if mode == "idle" and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        time.sleep(3600)
    sys.exit(0)  # the restarted run only reports what it was given
for step in (1, 2, 3):
    d = os.path.join(ckpt, "global_step%d" % step)
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "mp_rank_00_model_states.pt")
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data.pkl", b"x" * 4096)
    if step == 3 and mode == "truncate3":
        os.truncate(p, 100)  # the node died while step 3's data was still in flight
    with open(os.path.join(ckpt, "latest.tmp"), "w") as f:
        f.write("global_step%d" % step)
    os.replace(os.path.join(ckpt, "latest.tmp"), os.path.join(ckpt, "latest"))  # written last
    job.heartbeat(step)
    print("step %d done" % step, flush=True)
time.sleep(3600)
"""


def sim_for_users(base: Path, receiver: Receiver, nodes: int) -> SimCluster:
    # all drains in these tests are intended: the blast-radius guard is not under test here
    return SimCluster(
        base,
        n_nodes=nodes,
        webhook_url=receiver.url + "/hook",
        policy={"max_drained_fraction": 1.0},
        extra_config={
            "blast_radius": {f"{s}_fraction": 1.0 for s in ("switch", "partition", "cluster")}
        },
    )


@pytest.fixture
def user_sim(
    users_base: Path, receiver: Receiver, slurm_daemons: str, request: pytest.FixtureRequest
) -> Iterator[SimCluster]:
    """A whole installation under a directory the test users can traverse (they read
    slurm.conf and load the SPANK plugin in sbatch)."""
    base = users_base / f"sim-{os.urandom(3).hex()}"
    s = sim_for_users(base, receiver, getattr(request, "param", 4))
    s.up()
    try:
        agents_reporting(s)
        yield s
    finally:
        slurm(s.info, "scancel", "--full", "--quiet", "-u", "root", check=False)
        for u in request.getfixturevalue("test_users"):
            slurm(s.info, "scancel", "--full", "--quiet", "-u", u.name, check=False)
        s.down()
        if not os.environ.get("BABYSITTER_KEEP_TEST_FILES"):
            s.cleanup()


def submit_as(sim: SimCluster, user: TestUser, ckpt: Path, mode: str, spec: str = "") -> int:
    assert sim.info is not None
    train = user.home / "train.py"
    if not train.exists():
        train.write_text(TRAIN.format(repo=str(REPO)))
    r = user.run(
        [
            "sbatch",
            "--parsable",
            "--exclusive",
            f"--babysit=ckpt={ckpt},max_requeues=3{spec}",
            "--open-mode=append",
            "-o",
            str(user.home / f"{mode}-{ckpt.name}.out"),
            "--wrap",
            f"exec {PY} {train} {mode}",
        ],
        env=sim.info.env(),
    )
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def out_of(user: TestUser, ckpt: Path, mode: str) -> str:
    p = user.home / f"{mode}-{ckpt.name}.out"
    return p.read_text() if p.exists() else ""


def snapshot(d: Path) -> dict[str, Any]:
    """Everything observable about a directory tree (names, owners, modes, inodes, times,
    content digests), read as root."""
    out: dict[str, Any] = {}
    for p in sorted([d, *d.rglob("*")]):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        out[str(p)] = (st.st_uid, st.st_mode, st.st_ino, st.st_mtime_ns, st.st_size, digest)
    return out


def history(sim: SimCluster, job: int) -> list[dict[str, Any]]:
    jobs = {j["job_id"]: j for j in sim.api("/api/v1/jobs")}
    return list((jobs.get(job) or {}).get("history") or [])


def requeued(client: CliSlurmClient, job: int) -> bool:
    return client.job(job).restart_count >= 1


def test_linked_state_dir_of_another_user_is_never_written(user_sim, test_users):
    """User A points `<ckpt>/.babysitter` at user B's. After a fault on A's node nothing in
    B's directory is created or changed, A's job is still requeued, and the job's history says
    why no resume point was recorded."""
    a, b = test_users
    sim = user_sim
    client = CliSlurmClient(slurm_conf=Path(sim.info.slurm_conf))
    b_ckpt = b.mkdir(b.home / "ckpt-b")
    b_state = b.mkdir(b_ckpt / ".babysitter")
    (b_state / "resume.json").write_text('{"path": "/b/own/step9"}')
    (b_state / "heartbeat-1.json").write_text('{"time": 1.0}')
    b.chown_tree(b_ckpt)
    before = snapshot(b_ckpt)

    a_ckpt = a.mkdir(a.home / "ckpt-a")
    (a_ckpt / ".babysitter").symlink_to(b_state)
    os.chown(a_ckpt / ".babysitter", a.uid, a.gid, follow_symlinks=False)

    job = submit_as(sim, a, a_ckpt, "complete")
    wait_for(lambda: "step 3 done" in out_of(a, a_ckpt, "complete"), 90, "A's job at step 3")
    node = client.job(job).nodes[0]
    sim.inject_xid(node, 2, 79, via="kmsg")
    wait_for(lambda: requeued(client, job), 60, "A's job requeued")

    assert snapshot(b_ckpt) == before  # nothing created or changed in B's directory
    h = [e for e in history(sim, job) if e.get("event") == "requeue"]
    assert h, history(sim, job)
    assert h[0]["resume_point"] is None
    assert "resume.json not written" in h[0]["checkpoint"]
    assert ".babysitter is a symbolic link (not followed)" in h[0]["checkpoint"]
    assert str(a_ckpt / "global_step3") in h[0]["checkpoint"]  # what A can read was found
    # A's job runs again; the plugin does not take B's resume.json either
    wait_for(lambda: "restart=1" in out_of(a, a_ckpt, "complete"), 90, "A's job restarted")
    assert "restart=1 resume_env=[]" in out_of(a, a_ckpt, "complete")
    assert snapshot(b_ckpt) == before


def hostile_dir(owner: TestUser, ckpt: Path) -> None:
    """Every trap of issue #14 in one checkpoint directory, owned by the job's user; plus one
    complete checkpoint the user can read (step1) and one the user cannot (step50, mode 0000:
    root could read it, the job cannot, so babysitter must not use it)."""
    owner.mkdir(ckpt)
    (ckpt / "loop1").symlink_to("loop2")
    (ckpt / "loop2").symlink_to("loop1")
    (ckpt / "etc").symlink_to("/etc")
    (ckpt / "step9").symlink_to("/etc")
    (ckpt / "latest").write_bytes(b"global_step" + b"9" * 1_000_000)  # a 1 MB tracker
    (ckpt / "latest_checkpointed_iteration.txt").write_text("²³")  # non-ASCII digits
    for name in ("step1", "step50", "step٣"):
        (ckpt / name).mkdir()
        (ckpt / name / "w.bin").write_bytes(b"w")
        (ckpt / name / ".complete").write_bytes(b"")
    (ckpt / ".babysitter").mkdir()
    owner.chown_tree(ckpt)
    (ckpt / "step50").chmod(0)
    old = time.time() - 3600
    for p in [ckpt, *ckpt.rglob("*")]:
        if p != ckpt / "step50" and not str(p).startswith(str(ckpt / "step50") + "/"):
            os.utime(p, (old, old), follow_symlinks=False)


@pytest.mark.parametrize("user_sim", [5], indirect=True)
def test_hostile_dir_never_stops_well_formed_jobs_and_resume_points_are_right(
    user_sim, test_users, receiver
):
    """Three babysat jobs of two users on three nodes, faults on all three nodes:
    - A's job wrote DeepSpeed step 3 (pointer last) seconds before the fault: resumes from 3;
    - B's job's step 3 is named by `latest` but truncated: resumes from step 2;
    - A's hostile job (links to /etc, a loop, a FIFO heartbeat, a 0000 checkpoint, a 1 MB
      tracker, non-ASCII digits): requeued too, from the one checkpoint A can read (step1),
      its history naming what was refused.
    All three nodes drained, an alert for each."""
    a, b = test_users
    sim = user_sim
    client = CliSlurmClient(slurm_conf=Path(sim.info.slurm_conf))
    ck3 = a.mkdir(a.home / "ckpt-3")
    ck2 = b.mkdir(b.home / "ckpt-2")
    hostile = a.home / "ckpt-hostile"
    hostile_dir(a, hostile)

    j3 = submit_as(sim, a, ck3, "complete")
    j2 = submit_as(sim, b, ck2, "truncate3")
    jh = submit_as(sim, a, hostile, "idle", spec=",hang_timeout=600")
    fifo = hostile / ".babysitter" / f"heartbeat-{jh}.json"
    os.mkfifo(fifo)
    os.chown(fifo, a.uid, a.gid)
    wait_for(lambda: "step 3 done" in out_of(a, ck3, "complete"), 90, "A's job at step 3")
    wait_for(lambda: "step 3 done" in out_of(b, ck2, "truncate3"), 90, "B's job at step 3")
    wait_for(lambda: client.job(jh).running, 60, "the hostile job running")
    nodes = {j: client.job(j).nodes[0] for j in (j3, j2, jh)}
    assert len(set(nodes.values())) == 3  # --exclusive: one job per node
    time.sleep(2)  # step 3 was written two seconds before the fault
    for node in nodes.values():
        sim.inject_xid(node, 0, 79, via="kmsg")

    for j in (j3, j2, jh):
        wait_for(lambda j=j: requeued(client, j), 60, f"job {j} requeued")
    for node in nodes.values():
        state = slurm(sim.info, "sinfo", "-h", "-N", "-n", node, "-o", "%t").stdout.strip()
        assert "drain" in state or state.startswith("drng"), (node, state)

    def alerted() -> set[str]:
        out: set[str] = set()
        for body in receiver.bodies("/hook"):
            if str(body.get("condition", "")).startswith("node_unhealthy"):
                out |= {body.get("node"), *(body.get("nodes") or [])}  # grouped alerts too
        return out

    wait_for(lambda: alerted() >= set(nodes.values()), 30, "an alert for each drained node")

    # the restarted jobs get their resume points from the plugin
    wait_for(lambda: "restart=1" in out_of(a, ck3, "complete"), 120, "A's job restarted")
    wait_for(lambda: "restart=1" in out_of(b, ck2, "truncate3"), 120, "B's job restarted")
    assert f"restart=1 resume_env=[{ck3 / 'global_step3'}]" in out_of(a, ck3, "complete")
    assert f"restart=1 resume_env=[{ck2 / 'global_step2'}]" in out_of(b, ck2, "truncate3")
    # resume.json is the owner's, not root's
    assert (ck3 / ".babysitter" / "resume.json").stat().st_uid == a.uid
    assert (ck2 / ".babysitter" / "resume.json").stat().st_uid == b.uid

    h = [e for e in history(sim, jh) if e.get("event") == "requeue"]
    assert h, history(sim, jh)
    why = h[0]["checkpoint"]
    assert h[0]["resume_point"] == str(hostile / "step1"), why  # never the 0000 step50
    assert "etc -> /etc leaves the checkpoint directory" in why
    assert "loop1: link to a link: not followed" in why
    assert "latest is 1000011 bytes, over the 4096-byte cap" in why
    assert "not a number of at most 12 ASCII digits" in why
    assert "step50 (cannot open: permission denied" in why  # skipped for its mode, named
    assert (hostile / ".babysitter" / "resume.json").stat().st_uid == a.uid
    assert not (Path("/etc") / ".babysitter").exists()


# ---- the helper as a real user, without Slurm


def test_helper_uses_only_what_the_owner_can_read(test_users):
    a, b = test_users
    ckpt = a.mkdir(a.home / f"direct-{os.urandom(3).hex()}")
    for name in ("step1", "step5"):
        (ckpt / name).mkdir()
        (ckpt / name / "w.bin").write_bytes(b"w")
        (ckpt / name / ".complete").write_bytes(b"")
    a.chown_tree(ckpt)
    (ckpt / "step5").chmod(0)  # root could read it; A cannot
    out = owner.prepare_resume(str(ckpt), a.name, 9, 1, settle_s=0)
    assert out.resume_point == str(ckpt / "step1"), out.explanation
    assert "step5 (cannot open: permission denied" in out.explanation
    st = (ckpt / ".babysitter" / "resume.json").stat()
    assert (st.st_uid, st.st_gid) == (a.uid, a.gid)  # written as A, not as root
    # B cannot even enter A's directory when A closes it: nothing is read, nothing written
    ckpt.chmod(0o700)
    out = owner.prepare_resume(str(ckpt), b.name, 9, 2, settle_s=0)
    assert out.resume_point is None and "permission denied" in out.explanation


def test_helper_never_writes_through_a_link_to_another_users_dir(test_users):
    a, b = test_users
    b_state = b.mkdir(b.home / f"state-{os.urandom(3).hex()}")
    (b_state / "resume.json").write_text("{}")
    b.chown_tree(b_state)
    b_state.chmod(0o777)  # even a directory B left world-writable is not written into
    before = snapshot(b_state)
    ckpt = a.mkdir(a.home / f"linked-{os.urandom(3).hex()}")
    (ckpt / "step1").mkdir()
    (ckpt / "step1" / "w.bin").write_bytes(b"w")
    (ckpt / "step1" / ".complete").write_bytes(b"")
    (ckpt / ".babysitter").symlink_to(b_state)
    a.chown_tree(ckpt)
    out = owner.prepare_resume(str(ckpt), a.name, 9, 1, settle_s=0)
    assert out.resume_point is None
    assert ".babysitter is a symbolic link (not followed)" in out.explanation
    assert snapshot(b_state) == before


def test_ckpt_naming_a_system_directory_writes_nothing_there(test_users):
    """`--babysit=ckpt=/etc`: read as the job's owner (nothing complete there), and no
    `.babysitter` is created in /etc (as root, it used to be)."""
    a, _ = test_users
    out = owner.prepare_resume("/etc", a.name, 9, 1, settle_s=0)
    assert out.resume_point is None
    assert not Path("/etc/.babysitter").exists()
