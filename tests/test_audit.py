"""The audit log: every automatic drain and every admin resume has an entry with actor, time,
evidence and result; it is read through GET /api/v1/audit and `babysitter audit`, by a read
token too, and pruned after audit_retention_days."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from babysitter.cli import audit_cmd
from babysitter.cli.tree import cli
from babysitter.cli.when import parse_duration, parse_time
from babysitter.controller.db import audit
from tests.fixtures.reports import DBE, wire_report
from tests.fixtures.slurm import node_state, wait_for
from tests.test_remediation import XID79, engine, send, tick


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """SQLite only: the audit trail's reads and writes are covered on both by test_api."""
    return sqlite_url


def bearer(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


@pytest.mark.slurm
def test_automatic_drain_and_admin_resume_are_audited(clean_cluster, ctl, secrets):
    eng = engine(ctl.store, clean_cluster)
    for n in clean_cluster.nodes:
        send(ctl.store, n)
    send(ctl.store, "node2", XID79)
    tick(eng)
    assert node_state(clean_cluster, "node2")[0] == "drain"
    [drain] = [e for e in audit.entries(ctl.store, node="node2") if e.kind == "drain"]
    assert drain.actor == "policy" and drain.result is audit.AuditResult.DONE
    assert drain.rule == "critical_finding" and "XID 79" in (drain.reason or "")
    assert [f["code"] for f in drain.evidence] == ["xid.79"]  # the finding behind it

    # the node is clean again but an admin resumes it at once, through the API
    send(ctl.store, "node2")
    api = TestClient(ctl.app())
    r = api.post(
        "/api/v1/nodes/node2/resume",
        headers=bearer(secrets.admin, **{"X-Babysitter-Actor": "alice@login1"}),
    )
    assert r.status_code == 202
    tick(eng)
    wait_for(lambda: node_state(clean_cluster, "node2")[0] == "idle", 15, "node2 resumed")
    resumes = [e for e in audit.entries(ctl.store, node="node2") if e.kind == "resume"]
    assert [(e.actor, e.result) for e in resumes] == [
        ("admin", audit.AuditResult.DONE),  # settled by the loop (newest first)
        ("admin (alice@login1)", audit.AuditResult.REQUESTED),
    ]
    assert resumes[0].action_id == resumes[1].action_id == r.json()["action_id"]

    # the read token reads it; the API has the same entries
    got = api.get("/api/v1/audit", params={"node": "node2"}, headers=bearer(secrets.read))
    assert got.status_code == 200
    seen = [(e["kind"], e["result"]) for e in got.json()]
    assert seen[-1] == ("drain", "done")  # oldest last
    # (other steps, e.g. the healer's, may add entries of their own)
    assert {
        ("drain", "done"),
        ("requeue_jobs", "done"),  # the drain's follow-up (no babysat job here)
        ("resume", "done"),
        ("resume", "requested"),
    } <= set(seen)


def test_admin_requests_are_audited_with_who_asked(ctl, secrets):
    api = TestClient(ctl.app())
    api.post("/api/v1/reports", json=wire_report("node1", [DBE]), headers=secrets.headers("node1"))
    r = api.post(
        "/api/v1/nodes/node1/drain",
        json={"reason": "swap GPU 3"},
        # not a plain user@host word: ignored, not stored
        headers=bearer(secrets.admin, **{"X-Babysitter-Actor": "<script>alert(1)</script>"}),
    )
    assert r.status_code == 202
    [e] = audit.entries(ctl.store)
    assert (e.kind, e.actor, e.result, e.reason) == ("drain", "admin", "requested", "swap GPU 3")
    assert [f["code"] for f in e.evidence] == ["ecc.dbe.volatile"]
    # the read token may look but not act
    assert api.post("/api/v1/nodes/node1/resume", headers=bearer(secrets.read)).status_code == 403
    assert len(audit.entries(ctl.store)) == 1


def test_audit_filters_by_node_and_time(ctl, secrets):
    old = datetime.now(UTC) - timedelta(hours=3)
    audit.record(
        ctl.store,
        audit.AuditEntry("drain", "policy", audit.AuditResult.DONE, node="node1", at=old),
        audit.AuditEntry("drain", "policy", audit.AuditResult.FAILED, node="node2"),
        audit.AuditEntry("guard", "policy", audit.AuditResult.DONE),
    )
    api = TestClient(ctl.app())
    h = bearer(secrets.read)
    assert [e["node"] for e in api.get("/api/v1/audit", headers=h).json()] == [
        None,
        "node2",
        "node1",
    ]
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    recent = api.get("/api/v1/audit", params={"since": since}, headers=h).json()
    assert {e["kind"] for e in recent} == {"drain", "guard"} and len(recent) == 2
    one = api.get("/api/v1/audit", params={"node": "node1"}, headers=h).json()
    assert [e["result"] for e in one] == ["done"]
    assert api.get("/api/v1/audit", params={"node": "../x"}, headers=h).status_code == 422
    assert api.get("/api/v1/audit").status_code == 401


def test_cli_audit(ctl, secrets, monkeypatch):
    audit.record(
        ctl.store,
        audit.AuditEntry(
            "drain",
            "policy",
            audit.AuditResult.DONE,
            node="node3",
            reason="babysitter: XID 79",
            evidence=[{"code": "xid.79", "component": "gpu3"}],
            at=datetime.now(UTC) - timedelta(days=2),
        ),
        audit.AuditEntry("resume", "admin (bob@login1)", audit.AuditResult.DONE, node="node3"),
        audit.AuditEntry("drain", "policy", audit.AuditResult.DONE, node="node4"),
    )
    app = ctl.app()
    # the command's HTTP client is the in-process app (TestClient is an httpx.Client)
    monkeypatch.setattr(
        audit_cmd, "client", lambda state, url, token: TestClient(app, headers=bearer(secrets.read))
    )
    run = CliRunner().invoke(cli, ["audit", "--node", "node3", "--json"])
    assert run.exit_code == 0, run.output
    assert [e["actor"] for e in json.loads(run.output)] == ["admin (bob@login1)", "policy"]
    run = CliRunner().invoke(cli, ["audit", "--node", "node3", "--since", "1d", "--json"])
    assert [e["kind"] for e in json.loads(run.output)] == ["resume"]
    table = CliRunner().invoke(cli, ["audit", "--node", "node3"], env={"COLUMNS": "250"})
    assert "xid.79 gpu3" in table.output and "bob@login1" in table.output
    bad = CliRunner().invoke(cli, ["audit", "--since", "yesterday-ish"])
    assert bad.exit_code == 2 and "neither an ISO time" in bad.output


def test_audit_entries_are_pruned_after_their_retention(ctl):
    from babysitter.controller.db.retention import Retention

    now = datetime.now(UTC)
    days = ctl.cfg.controller.audit_retention_days
    audit.record(
        ctl.store,
        audit.AuditEntry("drain", "policy", "done", node="old", at=now - timedelta(days=days + 1)),
        audit.AuditEntry("drain", "policy", "done", node="kept", at=now - timedelta(days=days - 1)),
    )
    Retention(ctl.store, ctl.cfg.controller).run_once(now)
    assert [e.node for e in audit.entries(ctl.store)] == ["kept"]


def test_times_on_the_command_line():
    now = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("90") is None and parse_duration("m") is None
    assert parse_time("90m", now, past=False) == datetime(2026, 11, 26, 4, 30, tzinfo=UTC)
    assert parse_time("2d", now, past=True) == datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
    assert parse_time("2026-11-26T05:00Z", now, past=False).hour == 5
    with pytest.raises(ValueError):
        parse_time("soon", now, past=False)
