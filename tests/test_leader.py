"""Two controllers on one Postgres: exactly one acts (advisory-lock leader), both ingest; kill
the leader and the other takes over."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import httpx

from tests.fixtures.controller import ControllerProcess, controller_config, free_port
from tests.fixtures.slurm import slurm, wait_for


def leader(ctl: ControllerProcess) -> bool:
    try:
        return bool(httpx.get(ctl.url + "/readyz", timeout=2).json()["leader"])
    except (httpx.HTTPError, ValueError):
        return False


def post_fault(ctl: ControllerProcess, secrets, node: str) -> None:
    body = {
        "node": node,
        "report_id": str(uuid.uuid4()),
        "sent_at": datetime.now(UTC).isoformat(),
        "findings": [
            {
                "check": "xid.nvml",
                "component": "gpu0",
                "severity": "critical",
                "code": "xid.79",
                "message": "XID 79 on GPU 0",
                "action": "reboot",
            }
        ],
        "metrics": {},
    }
    r = httpx.post(
        ctl.url + "/api/v1/reports",
        json=body,
        timeout=10,
        headers=secrets.headers(node),
    )
    assert r.status_code == 202


def drained(info, node: str) -> bool:
    out = slurm(info, "sinfo", "-h", "-N", "-n", node, "-o", "%t").stdout.strip()
    return out.rstrip("*") in ("drain", "drng")


def test_one_leader_acts_and_the_other_takes_over(clean_cluster, secrets, pg_url, tmp_path):
    env = {
        "BABYSITTER_SLURM__SLURM_CONF": clean_cluster.slurm_conf,
        "BABYSITTER_POLICY__MAX_DRAINED_FRACTION": "1.0",
    }
    a = ControllerProcess(
        controller_config(secrets, pg_url, port=free_port()), env=env, log=tmp_path / "a.log"
    ).start()
    wait_for(lambda: leader(a), 20, "first controller leads")
    b = ControllerProcess(
        controller_config(secrets, pg_url, port=free_port()), env=env, log=tmp_path / "b.log"
    ).start()
    try:
        for _ in range(10):
            assert leader(a) and not leader(b)
        post_fault(b, secrets, "node2")  # a replica ingests; the leader acts
        wait_for(lambda: drained(clean_cluster, "node2"), 30, "node2 drained by the leader")
        acts = httpx.get(
            a.url + "/api/v1/actions",
            timeout=5,
            headers={"Authorization": f"Bearer {secrets.admin}"},
        ).json()
        assert [x["node"] for x in acts if x["kind"] == "drain"] == ["node2"]

        a.kill9()
        wait_for(lambda: leader(b), 30, "second controller takes over")
        post_fault(b, secrets, "node3")
        wait_for(lambda: drained(clean_cluster, "node3"), 30, "node3 drained by the new leader")
    finally:
        a.stop()
        b.stop()


def test_ingest_only_replica_never_leads(clean_cluster, secrets, pg_url, tmp_path):
    """The replica with remediation = false starts first and never takes the advisory lock:
    the remediating controller started after it leads and drains; /readyz says so."""
    env = {
        "BABYSITTER_SLURM__SLURM_CONF": clean_cluster.slurm_conf,
        "BABYSITTER_POLICY__MAX_DRAINED_FRACTION": "1.0",
    }
    replica = ControllerProcess(
        controller_config(secrets, pg_url, port=free_port(), controller={"remediation": False}),
        env=env,
        log=tmp_path / "replica.log",
    ).start()
    try:
        r = httpx.get(replica.url + "/readyz", timeout=2).json()
        progress = r.pop("loop_progress_age_s")  # how long since its loop last ticked
        assert r == {"database": "ok", "leader": False, "remediation": False}
        assert progress is None or progress >= 0
        actor = ControllerProcess(
            controller_config(secrets, pg_url, port=free_port()), env=env, log=tmp_path / "a.log"
        ).start()
        try:
            wait_for(lambda: leader(actor), 20, "the remediating controller leads")
            assert not leader(replica)
            post_fault(replica, secrets, "node2")
            wait_for(lambda: drained(clean_cluster, "node2"), 30, "node2 drained by the leader")
            assert httpx.get(actor.url + "/readyz", timeout=2).json()["remediation"] is True
        finally:
            actor.stop()
    finally:
        replica.stop()
