"""The policy's one read a tick (db/policy_read.py): the node rows that may need a decision and
every node's XIDs of the escalation window in one statement, on SQLite and a real Postgres.
It was two reads of tables the ingest writes; the union must give the policy the same rows."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import event

from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.policy_read import policy_rows, policy_view
from babysitter.controller.db.store import Store
from babysitter.finding import Finding
from babysitter.report import Report

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def xid(code: str, at: datetime, gpu: int = 3) -> Finding:
    return Finding(
        check="gpu.xid",
        component=f"gpu{gpu}",
        severity="critical",
        code=code,
        message=f"{code} on GPU {gpu}",
        action="reboot",
        observed_at=at,
    )


def report(store: Store, node: str, at: datetime, *findings: Finding) -> None:
    ReportWriter(store).write(
        [Report(node=node, report_id=str(uuid.uuid4()), sent_at=at, findings=list(findings))]
    )


def test_a_node_whose_xid_cleared_is_read_with_its_window_and_nothing_else_is(db_url):
    """Four nodes, all healthy now: n1 had XID 79 twice in the window (read once each, with
    aware times, however many reports repeated them), n2 an XID older than the window (not
    read), n3 a finding whose code is not a number (read, as any `xid.` code in the window,
    but not counted), n4 nothing. A steady read names none of them: n1 and n3 come back for
    their XIDs, in one statement; named, n4 comes back too, in name order."""
    store = Store(db_url)
    store.upgrade()
    try:
        since = NOW - timedelta(hours=24)
        report(store, "n1", NOW - timedelta(hours=2), xid("xid.79", NOW - timedelta(hours=2)))
        report(store, "n1", NOW - timedelta(hours=1), xid("xid.79", NOW - timedelta(hours=1)))
        # the agent's next reports repeat it (a sticky event finding): one event, one row
        for m in (30, 31):
            later = NOW - timedelta(minutes=m)
            report(store, "n1", later, xid("xid.79", NOW - timedelta(hours=1)))
        report(store, "n2", NOW - timedelta(hours=30), xid("xid.48", NOW - timedelta(hours=30)))
        report(store, "n3", NOW - timedelta(hours=1), xid("xid.foo", NOW - timedelta(hours=1)))
        for n in ("n1", "n2", "n3", "n4"):
            report(store, n, NOW)  # clean now: nothing open
            store.set_node(n, verdict="healthy")
        statements: list[str] = []
        event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        view = policy_view(store, since, stale_before=NOW - timedelta(minutes=5))
        assert len(statements) == 1
        assert [r["name"] for r in view.rows] == ["n1", "n3"]
        assert view.rows[0]["open_findings"] == []
        assert view.rows[0]["last_report_at"].tzinfo is not None  # stamped at ingest
        assert sorted(view.xids) == ["n1"]
        assert sorted(view.xids["n1"]) == [
            ("gpu3", 79, NOW - timedelta(hours=2)),
            ("gpu3", 79, NOW - timedelta(hours=1)),
        ]
        named = policy_view(store, since, stale_before=NOW - timedelta(minutes=5), names={"n4"})
        assert [r["name"] for r in named.rows] == ["n1", "n3", "n4"]
        full = policy_view(store, since, full=True)
        assert [r["name"] for r in full.rows] == ["n1", "n2", "n3", "n4"]
        assert full.xids == view.xids
        assert [r["name"] for r in policy_rows(store, ["n3", "n2"])] == ["n2", "n3"]
    finally:
        store.close()
