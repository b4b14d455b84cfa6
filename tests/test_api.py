"""The controller API against a real database: SQLite and Postgres (same suite)."""

from __future__ import annotations

import pytest

from tests.fixtures.reports import DBE, WARN, wire_report


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_report_is_accepted_and_visible(client, secrets):
    r = client.post(
        "/api/v1/reports", json=wire_report("node1", [DBE]), headers=secrets.headers("node1")
    )
    assert r.status_code == 202
    n = client.get("/api/v1/nodes/node1", headers=auth(secrets.admin)).json()
    assert n["verdict"] == "unhealthy"
    assert n["open_findings"][0]["code"] == "ecc.dbe.volatile"
    hist = client.get(
        "/api/v1/findings", params={"node": "node1"}, headers=auth(secrets.read)
    ).json()
    assert [f["code"] for f in hist] == ["ecc.dbe.volatile"]


def test_same_report_id_twice_is_stored_once(client, secrets, ctl):
    body = wire_report("node1", [DBE])
    h = secrets.headers("node1")
    assert client.post("/api/v1/reports", json=body, headers=h).status_code == 202
    r2 = client.post("/api/v1/reports", json=body, headers=h)
    assert r2.status_code == 200 and r2.json()["stored"] is False
    assert ctl.store.count("reports") == 1
    assert ctl.store.count("findings") == 1


def test_auth_rules(client, secrets):
    body = wire_report("node2")
    assert client.post("/api/v1/reports", json=body).status_code == 401
    assert (
        client.post("/api/v1/reports", json=body, headers=secrets.headers("node1")).status_code
        == 403
    )
    assert client.post("/api/v1/reports", json=body, headers=auth("garbage")).status_code == 403
    # any byte can arrive in a header: a non-ASCII token is refused like any other
    odd = {"Authorization": b"Bearer caf\xe9\xff"}
    assert client.post("/api/v1/reports", json=body, headers=odd).status_code == 403
    assert client.get("/api/v1/nodes", headers=odd).status_code == 403
    # admin endpoints refuse node tokens
    assert client.get("/api/v1/nodes", headers=secrets.headers("node1")).status_code == 403
    assert (
        client.post(
            "/api/v1/nodes/node1/drain", json={"reason": "x"}, headers=secrets.headers("node1")
        ).status_code
        == 403
    )
    # read token reads but cannot act
    assert client.get("/api/v1/nodes", headers=auth(secrets.read)).status_code == 200
    assert client.post("/api/v1/nodes/node1/resume", headers=auth(secrets.read)).status_code == 403
    assert client.get("/api/v1/nodes").status_code == 401


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda b: b.update(report_id="not-a-uuid"), "report_id"),
        (lambda b: b["findings"].append({**DBE, "severity": "apocalyptic"}), "severity"),
        (lambda b: b.pop("sent_at"), "sent_at"),
        (lambda b: b["findings"].append({**DBE, "component": "gpu3; rm"}), "component"),
    ],
)
def test_malformed_body_is_422_naming_the_field(client, secrets, mutate, field):
    body = wire_report("node1")
    mutate(body)
    r = client.post("/api/v1/reports", json=body, headers=secrets.headers("node1"))
    assert r.status_code == 422
    locs = [".".join(map(str, e["loc"])) for e in r.json()["detail"]]
    assert any(field in loc for loc in locs), locs


def test_clean_report_clears_open_findings_and_counts_clean_reports(client, secrets):
    h = secrets.headers("node1")
    client.post("/api/v1/reports", json=wire_report("node1", [DBE]), headers=h)
    for _ in range(3):
        client.post("/api/v1/reports", json=wire_report("node1"), headers=h)
    n = client.get("/api/v1/nodes/node1", headers=auth(secrets.admin)).json()
    assert n["open_findings"] == [] and n["consecutive_clean"] == 3
    assert n["verdict"] == "healthy"


def test_a_jobs_log_line_or_a_warning_does_not_hold_a_drained_node_back(client, secrets):
    """A job's NCCL log (a job-owned finding) stays open and visible, but the node's reports
    still count as clean: the policy can resume a drained node while that job runs on."""
    h = secrets.headers("node1")
    nccl = {
        **WARN,
        "check": "nccl.logs",
        "component": "job:4242",
        "code": "nccl.watchdog_timeout",
        "message": "job 4242: NCCL watchdog timeout in its log",
    }
    client.post("/api/v1/reports", json=wire_report("node1", [DBE]), headers=h)
    for _ in range(3):
        client.post("/api/v1/reports", json=wire_report("node1", [nccl]), headers=h)
    n = client.get("/api/v1/nodes/node1", headers=auth(secrets.admin)).json()
    assert [f["check"] for f in n["open_findings"]] == ["nccl.logs"]
    assert n["consecutive_clean"] == 3 and n["verdict"] == "healthy"
    # a warning that drains nothing (the node shows suspect) does not hold it back either
    client.post("/api/v1/reports", json=wire_report("node1", [WARN]), headers=h)
    n = client.get("/api/v1/nodes/node1", headers=auth(secrets.admin)).json()
    assert n["consecutive_clean"] == 4 and n["verdict"] == "suspect"
    # the fault again: the count starts over
    client.post("/api/v1/reports", json=wire_report("node1", [DBE]), headers=h)
    n = client.get("/api/v1/nodes/node1", headers=auth(secrets.admin)).json()
    assert n["consecutive_clean"] == 0


def test_event_report_merges_into_open_findings(client, secrets):
    h = secrets.headers("node1")
    warn = {**DBE, "severity": "warning", "code": "pcie.width_degraded", "component": "gpu2"}
    client.post("/api/v1/reports", json=wire_report("node1", [warn]), headers=h)
    ev = {**wire_report("node1", [{**DBE, "code": "xid.79", "check": "xid.nvml"}]), "kind": "event"}
    assert client.post("/api/v1/reports", json=ev, headers=h).status_code == 202
    n = client.get("/api/v1/nodes/node1", headers=auth(secrets.admin)).json()
    assert {f["code"] for f in n["open_findings"]} == {"pcie.width_degraded", "xid.79"}


def test_manual_actions_are_recorded_pending(client, secrets):
    r = client.post(
        "/api/v1/nodes/node3/drain", json={"reason": "bad fan"}, headers=auth(secrets.admin)
    )
    assert r.status_code == 202
    client.post("/api/v1/jobs/42/requeue", headers=auth(secrets.admin))
    acts = client.get("/api/v1/actions", headers=auth(secrets.admin)).json()
    kinds = {(a["kind"], a["node"], a["job_id"], a["status"], a["requested_by"]) for a in acts}
    assert ("drain", "node3", None, "pending", "admin") in kinds
    assert ("requeue", None, 42, "pending", "admin") in kinds


def test_health_endpoints(client):
    assert client.get("/healthz").status_code == 200
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["database"] == "ok"
    assert "openapi" in client.get("/openapi.json").json()


def test_guard_reset_is_admin_only_and_recorded(client, secrets):
    assert client.post("/api/v1/guard/reset", headers=auth(secrets.read)).status_code == 403
    r = client.post("/api/v1/guard/reset", headers=auth(secrets.admin))
    assert r.status_code == 202
    acts = client.get("/api/v1/actions", headers=auth(secrets.admin)).json()
    assert [a["kind"] for a in acts] == ["guard_reset"]
