"""One type end to end: the report the agent builds is the model the API validates; the API's
node verdict is the policy's; a severity the database holds but nobody can read is never ok;
every decision names a rule an admin can look up."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from babysitter.controller.api import api_read, fastpath, ingest
from babysitter.controller.api import app as api
from babysitter.controller.db import models
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.node.decisions import Decision
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.node.policy import decide
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.decide.node.verdict import node_verdict
from babysitter.controller.runtime import Controller
from babysitter.finding import Action, Finding, Severity
from babysitter.report import Report
from tests.fixtures.controller import Secrets, offline_agent_config


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def finding(severity: Severity, **kw: object) -> Finding:
    base: dict[str, object] = {
        "check": "gpu.memory",
        "component": "gpu0",
        "severity": severity,
        "code": f"c.{severity}",
        "message": f"a {severity} finding",
    }
    return Finding.from_dict({**base, **kw})


# ---- one report model


def test_the_agents_report_is_the_model_the_api_validates(secrets: Secrets, tmp_path: Path):
    from babysitter.agent.daemon import Agent

    cfg = offline_agent_config(secrets, tmp_path)
    agent = Agent(cfg)
    f = finding(Severity.CRITICAL, action=Action.RESET_GPU, details={"dbe": 1})
    wire = json.dumps(agent._report([f], "event"), allow_nan=False).encode()
    # the route and the fast path parse with the same class the agent built it with
    assert api.Report is fastpath.Report is ingest.Report is Report
    got = Report.model_validate_json(wire)
    assert got.node == "node7" and got.kind == "event"
    assert got.findings == [f]
    assert got.metrics["spool_size"] == 0
    # and back to the same bytes: the wire format is the model's own
    assert json.dumps(got.to_json_dict()).encode() == json.dumps(json.loads(wire)).encode()


# ---- one verdict


NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
CASES = {
    "clean": [],
    "info": [finding(Severity.INFO)],
    "warning": [finding(Severity.WARNING)],
    "warning_drain": [finding(Severity.WARNING, action=Action.DRAIN)],
    "critical": [finding(Severity.CRITICAL)],
    # from a job's own log: never the node's verdict on its own
    "job_owned_critical": [finding(Severity.CRITICAL, check="nccl.logs", component="job:42")],
}


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """SQLite only: one verdict type is a matter of code, not of the database."""
    return sqlite_url


def test_the_api_shows_the_verdict_the_policy_acts_on(
    ctl: Controller, client: TestClient, secrets: Secrets
):
    assert api_read.node_verdict is node_verdict  # one function, not two that agree today
    for name, findings in CASES.items():
        body = Report.new(name.replace("_", "-"), findings, {}).to_json_dict()
        r = client.post("/api/v1/reports", json=body, headers=secrets.headers(body["node"]))
        assert r.status_code == 202, r.text
    shown = {
        n["name"]: n["verdict"]
        for n in client.get("/api/v1/nodes", headers=bearer(secrets.read)).json()
    }
    facts = [
        NodeFacts(name=n["name"], open_findings=tuple(n["open_findings"]), heartbeat_age_s=1.0)
        for n in ctl.store.node_rows()
    ]
    policy = decide(facts, ClusterFacts({"default": 10}), PolicySettings(), NOW).verdicts
    assert shown == policy
    assert shown["job-owned-critical"] == "healthy" and shown["warning-drain"] == "unhealthy"


# ---- an unreadable severity in the database


def test_a_misspelled_severity_in_the_database_is_not_ranked_ok(
    ctl: Controller, client: TestClient, secrets: Secrets, caplog: pytest.LogCaptureFixture
):
    body = Report.new("node1", [finding(Severity.INFO)], {}).to_json_dict()
    assert client.post("/api/v1/reports", json=body, headers=secrets.headers("node1")).is_success
    stored = body["findings"][0] | {"severity": "critcal"}  # written by hand, say
    with ctl.store.engine.begin() as c:
        c.execute(
            update(models.nodes)
            .where(models.nodes.c.name == "node1")
            .values(open_findings=[stored], worst_severity="critcal")
        )
    with caplog.at_level(logging.ERROR):
        (row,) = ctl.store.node_rows()
    assert "critcal" in caplog.text
    (f,) = row["open_findings"]
    assert f.severity is Severity.WARNING and row["worst_severity"] is Severity.WARNING
    node = client.get("/api/v1/nodes/node1", headers=bearer(secrets.read)).json()
    assert node["verdict"] == "suspect"  # not healthy
    assert node_verdict([f], 1.0, 120.0) == ("suspect", "warning_suspect")


def test_a_severity_compared_with_text_is_compared_by_rank():
    # the text on either side: not compared by spelling ("critical" < "info" as text)
    assert Severity.CRITICAL > "info" and "critical" > Severity.INFO  # noqa: SIM300
    with pytest.raises(ValueError):
        _ = Severity.WARNING < "critcal"


def test_unknown_severity_of_a_history_row_reads_as_warning(tmp_path: Path):
    store = Store(f"sqlite:///{tmp_path / 'h.db'}")
    store.upgrade()
    try:
        with store.engine.begin() as c:
            c.execute(
                models.reports.insert().values(
                    report_id="r1",
                    node="n1",
                    kind="full",
                    sent_at=NOW,
                    received_at=NOW,
                    n_findings=1,
                    worst_severity="bad",
                )
            )
            c.execute(
                models.findings.insert().values(
                    report_id="r1",
                    node="n1",
                    check="gpu.memory",
                    component="gpu0",
                    severity="Critical",
                    code="x",
                    message="m",
                    action="drain",
                    observed_at=NOW - timedelta(minutes=1),
                )
            )
        (row,) = store.findings()
        assert row["severity"] is Severity.WARNING and row["action"] is Action.DRAIN
        assert store.findings(severity=Severity.CRITICAL) == []  # filtered by the enum's order
    finally:
        store.close()


# ---- rules are data


def test_every_decision_names_a_rule():
    with pytest.raises(ValueError, match="not one of Rule"):
        Decision("drain", "n1", "critcal_finding", "why")
    facts = [
        NodeFacts("a", (finding(Severity.CRITICAL),), heartbeat_age_s=1.0),
        NodeFacts("b", heartbeat_age_s=999.0),
    ]
    res = decide(facts, ClusterFacts({"default": 2}), PolicySettings(), NOW)
    named = [d for d in res.decisions if d.rule]
    assert {d.rule for d in named} >= {"critical_finding", "heartbeat_missing"}
    assert all(d.rule_description == Rule(d.rule).description for d in named)


def test_actions_show_what_their_rule_means(client: TestClient, secrets: Secrets):
    r = client.post(
        "/api/v1/nodes/node1/drain", json={"reason": "maintenance"}, headers=bearer(secrets.admin)
    )
    assert r.status_code == 202
    (a,) = client.get("/api/v1/actions", headers=bearer(secrets.read)).json()
    assert a["rule"] == "manual" and a["rule_description"] == Rule.MANUAL.description
    # the API's shape of an action: every column of the actions table, plus the description
    assert list(a) == [
        *("id", "kind", "node", "job_id", "reason", "rule", "requested_by", "status"),
        *("outcome", "dry_run", "attempts", "created_at", "done_at", "next_attempt_at"),
        "rule_description",
    ]
    assert (a["kind"], a["status"], a["dry_run"], a["attempts"]) == ("drain", "pending", False, 0)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("component", "gpu3; rm -rf /", "component must be"),
        ("component", "gpu3\n", "component must be"),
        ("check", "GPU.Memory", "check must look like"),
        ("message", "x" * 2001, "message is longer than 2000"),
        ("code", 7, "code must be a string"),
        ("severity", "apocalyptic", "apocalyptic"),
        ("observed_at", "yesterday", "yesterday"),
    ],
)
def test_a_finding_a_check_builds_is_validated_like_one_the_api_receives(field, value, says):
    """Checks build Findings in Python on the node (no pydantic there): the same bounds hold."""
    good = finding(Severity.WARNING).to_json_dict()
    with pytest.raises(ValueError, match=says):
        Finding(**{**good, field: value})
    ok = finding(Severity.WARNING, observed_at="2026-01-01T00:00:00")
    assert ok.observed_at.tzinfo is not None and ok.severity is Severity.WARNING
    with pytest.raises(ValueError, match="unknown finding key"):
        Finding.from_dict({**ok.to_json_dict(), "extra": 1})
    assert Finding.from_dict(ok.to_json_dict()) == ok
