"""Fault isolation in the controller loop (issue 14.2): a hostile job's babysit spec raises
inside the job path; the rest of the tick (drains, alerts, other jobs) goes on, and the error
is recorded on the hostile job."""

from __future__ import annotations

import threading

import httpx

from babysitter.controller.runtime import Controller
from tests.fixtures.controller import ControllerProcess, controller_config, free_port
from tests.fixtures.slurm import slurm, submit, wait_for
from tests.test_leader import drained, post_fault


def job_info(cluster, job: int) -> tuple[str, str, int]:
    out = slurm(cluster, "squeue", "-h", "-j", str(job), "-o", "%T|%N").stdout.strip()
    state, _, node = out.partition("|")
    restarts = slurm(cluster, "scontrol", "show", "job", str(job)).stdout
    n = int(restarts.split("Restarts=")[1].split()[0]) if "Restarts=" in restarts else 0
    return state, node, n


def test_hostile_spec_does_not_stop_drains_alerts_or_other_requeues(
    clean_cluster, secrets, tmp_path, receiver
):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    good = submit(clean_cluster, "--exclusive", f"--comment=babysit=ckpt={ckpt}")
    # "²".isdigit() is True but int("²") raises: once enough to stop the whole tick
    bad = submit(clean_cluster, "--exclusive", "--comment=babysit=max_requeues=²")
    wait_for(
        lambda: (
            job_info(clean_cluster, good)[0] == "RUNNING"
            and job_info(clean_cluster, bad)[0] == "RUNNING"
        ),
        30,
        "both jobs running",
    )
    good_node, bad_node = job_info(clean_cluster, good)[1], job_info(clean_cluster, bad)[1]
    assert good_node != bad_node
    cfg = controller_config(
        secrets,
        f"sqlite:///{tmp_path / 'i.db'}",
        port=free_port(),
        alerts={"webhook_url": receiver.url + "/hook"},
        policy={"max_drained_fraction": 1.0},
    )
    env = {"BABYSITTER_SLURM__SLURM_CONF": clean_cluster.slurm_conf}
    ctl = ControllerProcess(cfg, env=env, log=tmp_path / "ctl.log").start(timeout=90)
    hdr = {"Authorization": f"Bearer {secrets.admin}"}

    def jobs() -> dict[int, dict]:
        return {j["job_id"]: j for j in httpx.get(ctl.url + "/api/v1/jobs", headers=hdr).json()}

    try:
        wait_for(lambda: bad in jobs(), 30, "the hostile job recorded")
        post_fault(ctl, secrets, good_node)
        post_fault(ctl, secrets, bad_node)
        for n in (good_node, bad_node):
            wait_for(lambda n=n: drained(clean_cluster, n), 30, f"{n} drained")
        wait_for(
            lambda: (
                {b["node"] for b in receiver.bodies("/hook") if b["state"] == "firing"}
                >= {good_node, bad_node}
            ),
            30,
            "both alerts",
        )
        wait_for(lambda: job_info(clean_cluster, good)[2] == 1, 60, "good job requeued")
        errors = [h for h in jobs()[bad]["history"] if h["event"] == "error"]
        assert errors and "max_requeues" in errors[0]["error"]
        assert jobs()[good]["requeues"] == 1
    finally:
        ctl.stop()


def test_watchdog_pings_only_while_the_loop_makes_progress(secrets, tmp_path):
    """A loop stuck in one item (here: a loop function that blocks, like a FIFO read would)
    stops the watchdog pings, so systemd restarts the service."""
    cfg = controller_config(
        secrets,
        f"sqlite:///{tmp_path / 'w.db'}",
        controller={"loop_interval_s": 0.05},
    )
    ctl = Controller(cfg)
    ctl.store.upgrade()
    stuck, release = threading.Event(), threading.Event()

    def item() -> None:
        if stuck.is_set():
            release.wait(30)

    ctl.add_loop("item", item)
    t = threading.Thread(target=ctl.loop_forever, daemon=True)
    t.start()
    wait_for(lambda: ctl.watchdog_ok(0.2), 10, "pings while the loop runs")
    stuck.set()
    wait_for(lambda: not ctl.watchdog_ok(0.2), 10, "watchdog withheld while stuck")
    stuck.clear()
    release.set()
    wait_for(lambda: ctl.watchdog_ok(0.2), 10, "watchdog resumes with progress")
    ctl._stop.set()
    t.join(timeout=5)
    ctl.close()
