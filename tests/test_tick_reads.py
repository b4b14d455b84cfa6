"""The tick reads each table once (db/tick_reads.py, issue 52): statements counted by an
SQLAlchemy event hook on the store's engine, over a 64-node cluster on the in-memory Slurm
stand-in, in steady ticks and in the ticks that handle a fault. A read repeated in one tick
without a write to its table in between is a defect (it was 13 of ~30 statements)."""

from __future__ import annotations

import re
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db import audit
from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.store import Store
from babysitter.controller.db.tick_reads import _written
from babysitter.controller.db.tickstore import record_actions
from babysitter.controller.loop.read.ledger import Ledger
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.finding import Finding
from babysitter.report import Report
from babysitter.slurm.client import SlurmJob
from bench.slurm_standin import InMemorySlurm

DBE = Finding(
    check="gpu.memory",
    component="gpu3",
    severity="critical",
    code="ecc.dbe.volatile",
    message="GPU 3: 1 volatile uncorrected ECC error",
    action="reset_gpu",
)
WRITE = re.compile(r'^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)', re.I)
READ_TABLE = re.compile(r'\bFROM\s+"?(\w+)', re.I)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Store, list[str], RemediationEngine]]:
    store, names, engine = _cluster(tmp_path)
    yield store, names, engine
    engine.close()
    store.close()


def _cluster(tmp_path: Path) -> tuple[Store, list[str], RemediationEngine]:
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    names = [f"n{i:03d}" for i in range(64)]
    now = datetime.now(UTC)
    ReportWriter(store).write([_report(x, now) for x in names])
    slurm = InMemorySlurm(names)
    for j, x in enumerate(names):  # a babysat job on every node
        slurm.add_job(SlurmJob(j + 1, states=("RUNNING",), nodes=(x,), comment="babysit=ckpt=/x"))
    engine = make_engine(parse_config({"checks": {"sdc": {"enabled": False}}}), store, slurm=slurm)
    engine.tick()  # the first tick records the jobs
    return store, names, engine


def _report(node: str, now: datetime, *findings: Finding) -> Report:
    return Report(
        node=node, report_id=str(uuid.uuid4()), sent_at=now, findings=list(findings), metrics={}
    )


def _statements(store: Store, engine: RemediationEngine) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    def hook(_c: Any, _cur: Any, statement: str, params: Any, *_: Any) -> None:
        seen.append((statement, repr(params)))

    event.listen(store.engine, "before_cursor_execute", hook)
    try:
        engine.tick()
    finally:
        event.remove(store.engine, "before_cursor_execute", hook)
    return seen


def _repeated_reads(statements: list[tuple[str, Any]]) -> list[str]:
    """Reads made again with the same statement and parameters while nothing wrote their
    table in between."""
    since_write: dict[str, set[tuple[str, Any]]] = {}
    repeated = []
    for sql, params in statements:
        if w := WRITE.match(sql):
            since_write.pop(w.group(1).lower(), None)
            continue
        if not sql.lstrip().upper().startswith("SELECT"):
            continue
        table = (READ_TABLE.search(sql) or re.match("(.*)", "?")).group(1).lower()
        seen = since_write.setdefault(table, set())
        if (sql, params) in seen:
            repeated.append(sql[:90])
        seen.add((sql, params))
    return repeated


def test_a_steady_tick_reads_each_table_once(cluster):
    store, _, engine = cluster
    engine.tick()
    statements = _statements(store, engine)
    assert _repeated_reads(statements) == []
    assert not [s for s, _ in statements if WRITE.match(s)]  # nothing changed: nothing written
    # 64 nodes, a babysat job on each: 23 statements before the tick read once. With SQLite a
    # steady tick reads only what changed since the last: the nodes that may need a decision
    # and the recent XIDs (both written by the ingest), nothing else, in one statement
    assert len(statements) <= 1, Counter(s[:80] for s, _ in statements)


def test_a_tick_with_a_fault_rereads_only_what_it_wrote(cluster):
    store, names, engine = cluster
    engine.tick()  # steady: what the first tick wrote (the guard's kv) is read again here
    ReportWriter(store).write([_report(names[0], datetime.now(UTC), DBE)])
    counts = []
    for _ in range(3):  # the drain, then the ladder's first rung, then the requeue
        statements = _statements(store, engine)
        assert _repeated_reads(statements) == []
        counts.append(len(statements))
    assert any(a.kind is ActionKind.DRAIN and a.node == names[0] for a in store.actions())
    # 46 at fc1c4ca, 26 once reads were remembered; a step no longer reads back the row it has
    # just written, an alert, a kv value or a job is one upsert, and the open findings the
    # policy read serve the executor, the healer and the audit (20). The tick's own writes of
    # actions keep its reads of them current (db/action_view.py), a drain starts its episode
    # in its own update, and the tick's audit entries are one write: 13, 10 and 7. The
    # healer's own ledger writes keep its reads current, its starts are one insert, and a
    # requeue run writes its outcomes, its jobs and the requeues it queues once, the open
    # episodes and the lemon count are one view of the ledger, and the pending actions and
    # the requeue lookup one listing: 11, 8 and 6. The policy's node rows and the XIDs of the
    # window are one read (db/policy_read.py): 10, 7 and 5. A drained node's verdict is
    # written with its drain (one write of its row a tick): 9. A settle's outcomes and the
    # follow-ups they lead to are one upsert: 8, 6 and 5
    assert counts[0] <= 8 and max(counts[1:]) <= 6, counts


def test_a_node_moved_in_a_tick_has_its_row_written_once(cluster):
    """The drain's write of the node's row carries its verdict and Slurm state, as the
    tick's outcome has them (they were a second update of the row at the tick's end); a
    reader sees the node drained, by babysitter, with the verdict of the fault."""
    store, names, engine = cluster
    ReportWriter(store).write([_report(names[0], datetime.now(UTC), DBE)])
    sql = [s for s, _ in _statements(store, engine)]
    updates = [s for s in sql if re.match(r"\s*UPDATE nodes\b", s)]
    assert len(updates) == 1, updates
    row = store.node(names[0])
    assert row is not None and row["babysitter_drained"]
    assert row["verdict"] == "unhealthy" and "DRAIN" in row["slurm_state"].split("+")
    assert str(row["slurm_reason"]).startswith("babysitter")
    engine.tick()  # the next tick has nothing new to write for it
    assert store.node(names[0])["verdict"] == "unhealthy"


def _fault_ticks(where: Path, faulty: int) -> list[int]:
    """Statements in the drain, requeue_jobs and requeue ticks of `faulty` nodes failing
    together."""
    where.mkdir()
    store, names, engine = _cluster(where)
    try:
        engine.tick()
        ReportWriter(store).write([_report(x, datetime.now(UTC), DBE) for x in names[:faulty]])
        counts = [len(_statements(store, engine)) for _ in range(3)]
        requeued = [a for a in store.actions() if a.kind is ActionKind.REQUEUE]
        assert len(requeued) == faulty and {a.status for a in requeued} == {ActionStatus.DONE}
        episodes = Ledger(store).open_rows()
        assert sorted(r.node for r in episodes) == names[:faulty]
        jobs = {j["job_id"]: j for j in store.jobs()}
        for a in requeued:  # each job's own row says it was requeued
            assert jobs[a.job_id]["requeues"] == 1 and jobs[a.job_id]["state"] == "REQUEUED"
        return counts
    finally:
        engine.close()
        store.close()


def test_a_rack_failing_together_costs_the_statements_of_one_node(tmp_path):
    """The same statements whether one node or six have work (below the blast-radius guard,
    which is work of its own): the healer's starts, the drains' requeue_jobs and the jobs'
    requeues are each written once for all of them (they grew by 3, 2 and 3 a node)."""
    one = _fault_ticks(tmp_path / "1", 1)
    assert _fault_ticks(tmp_path / "3", 3) == one
    assert _fault_ticks(tmp_path / "6", 6) == one


def test_a_breaker_tripping_is_recorded_with_the_ticks_drains(cluster):
    """10 of 64 nodes failing at once trip the blast-radius breaker: its record in the
    actions log is written in the statement that records the tick's drains ahead of them (it
    was an insert of its own), and audited."""
    store, names, engine = cluster
    ReportWriter(store).write([_report(x, datetime.now(UTC), DBE) for x in names[:10]])
    sql = [s for s, _ in _statements(store, engine)]
    trips = [a for a in store.actions() if a.kind is ActionKind.GUARD]
    assert len(trips) == 1 and trips[0].status is ActionStatus.DONE
    assert trips[0].outcome == "breaker tripped: drains stopped"
    drains = [a for a in store.actions() if a.kind is ActionKind.DRAIN]
    assert drains and all(a.id < trips[0].id for a in drains)  # one statement, in its order
    inserts = [s for s in sql if s.lstrip().startswith("INSERT INTO actions")]
    # the drains and the breaker, the drains' follow-ups, the healer's records
    assert len(inserts) == 3, inserts
    assert trips[0].id in {e.action_id for e in audit.entries(store)}


def test_a_racks_follow_ups_cost_the_statements_of_one_nodes(tmp_path):
    """Nodes drained together: the tick that queues their jobs' requeues and the tick that
    requeues them read the actions table as often, and audit in as many statements, as for
    one node (each node's requeue_jobs read the pending actions again after the last one's
    insert, and each settled action was audited on its own: the statements grew with the
    rack)."""

    def follow_up_ticks(faulty: int) -> list[tuple[int, int]]:
        (where := tmp_path / str(faulty)).mkdir()
        store, names, engine = _cluster(where)
        try:
            now = datetime.now(UTC)
            ReportWriter(store).write([_report(x, now, DBE) for x in names[:faulty]])
            engine.tick()  # the drains
            drained = {a.node for a in store.actions() if a.kind is ActionKind.DRAIN}
            assert len(drained) == faulty
            out = []
            for _ in range(2):  # requeue_jobs (one per node), then the requeues (one per job)
                sql = [s for s, _ in _statements(store, engine)]
                reads = sum(1 for s in sql if re.match(r"\s*SELECT\b.*\bFROM actions\b", s, re.S))
                audits = sum(1 for s in sql if s.lstrip().startswith("INSERT INTO audit_log"))
                out.append((reads, audits))
            requeued = [a for a in store.actions() if a.kind is ActionKind.REQUEUE]
            assert len(requeued) == faulty and {a.status for a in requeued} == {ActionStatus.DONE}
            return out
        finally:
            engine.close()
            store.close()

    one = follow_up_ticks(1)
    assert one[0][1] == 1 and one[1][1] == 1
    assert follow_up_ticks(4) == one


def test_a_racks_audit_entries_are_written_once_at_the_ticks_end(tmp_path):
    """Four nodes drained in one tick, each held by the healer: eight entries, one statement
    (each step wrote its own before), all in the log once the tick is over."""
    from babysitter.controller.db import audit

    store, names, engine = _cluster(tmp_path)
    try:
        ReportWriter(store).write([_report(x, datetime.now(UTC), DBE) for x in names[:4]])
        sql = [s for s, _ in _statements(store, engine)]
        assert len([s for s in sql if s.lstrip().startswith("INSERT INTO audit_log")]) == 1
        logged = audit.entries(store)
        drains = {e.node for e in logged if e.kind == ActionKind.DRAIN}
        assert drains == set(names[:4])
        assert {e.node for e in logged if e.kind == ActionKind.INSPECT} == set(names[:4])
    finally:
        engine.close()
        store.close()


def test_an_update_whose_value_is_a_subquery_changes_only_its_column():
    """The executor's drain sets nodes.drain_episode from a subquery (commas, parentheses, a
    WHERE of its own): the reads of the node's other columns stay good."""
    drain = (
        "UPDATE nodes SET drain_episode=(SELECT coalesce(max(actions.id), ?) AS c FROM actions "
        "WHERE actions.kind = ?) WHERE nodes.name IN (?, ?)"
    )
    assert _written(drain) == ("nodes", "nodes.drain_episode")
    two = 'UPDATE kv SET value=?, "updated_at"=? WHERE kv."key" = ?'
    assert _written(two) == ("kv", "kv.value", "kv.updated_at")
    assert _written("UPDATE t SET (a, b) = (?, ?)") == ("t", "t#rows")  # not told: everything


def test_a_write_in_the_tick_is_read_back_by_the_next_step(tmp_path):
    """A step that reads after another step (or the API, or the ingest) wrote the table gets
    the new rows: the memory never hides a write."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    with store.tick_reads():
        assert store.pending_actions() == []
        assert store.firing_alerts() == []
        store.record_action(ActionKind.DRAIN, node="n1", reason="r")
        assert [a.node for a in store.pending_actions()] == ["n1"]
        # a write from another thread (an admin's request through the API) is seen too
        t = threading.Thread(
            target=lambda: store.record_action(ActionKind.RESUME, node="n2", reason="r")
        )
        t.start()
        t.join()
        assert [a.node for a in store.pending_actions()] == ["n1", "n2"]
        store.kv_set("k", {"a": 1})
        assert store.kv_get("k") == {"a": 1}
        store.kv_get("k")["a"] = 2  # a caller's change is its own, not the next reader's
        assert store.kv_get("k") == {"a": 1}
    store.close()


def test_only_the_tick_thread_reads_from_memory(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    counted: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: counted.append(a[2]))
    with store.tick_reads():
        store.pending_actions()
        store.pending_actions()
        assert len(counted) == 1
        other = threading.Thread(target=store.pending_actions)  # an API handler's read
        other.start()
        other.join()
        assert len(counted) == 2
    store.pending_actions()  # after the tick: from the database again
    assert len(counted) == 3
    store.close()


def test_a_read_remembered_across_ticks_sees_a_write_by_another_store(tmp_path):
    """Another Store of this process on the same database (the CLI's, a test's) writes: the
    tick's remembered read of that table is stale at once."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    store, other = Store(url), Store(url)
    store.upgrade()
    with store.tick_reads():
        assert store.pending_actions() == []
    other.record_action(ActionKind.DRAIN, node="n1", reason="admin")
    with store.tick_reads():
        assert [a.node for a in store.pending_actions()] == ["n1"]
    store.close()
    other.close()


def test_the_ingests_node_writes_leave_the_validation_read_good_but_a_drain_does_not(tmp_path):
    from babysitter.controller.db.episodes import start_drain_episodes, validation_history

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    ReportWriter(store).write([_report("n1", datetime.now(UTC))])
    store.record_action(ActionKind.VALIDATE, node="n1", reason="r", status=ActionStatus.DONE)
    counted: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: counted.append(a[2]))
    with store.tick_reads():
        assert validation_history(store)["n1"].state == "passed"
    ReportWriter(store).write([_report("n1", datetime.now(UTC))])  # a report: nodes updated
    with store.tick_reads():
        n = len(counted)
        assert validation_history(store)["n1"].state == "passed"
        assert len(counted) == n  # remembered: no statement
    start_drain_episodes(store, ["n1"])  # babysitter drains it: a new episode
    with store.tick_reads():
        assert "n1" not in validation_history(store)  # the old pass is not this drain's
    store.close()


def test_with_postgres_memory_lasts_one_tick(pg_url):
    """Other controllers write to a shared Postgres (their API, their ingest), unseen here:
    nothing is remembered from one tick to the next."""
    store = Store(pg_url)
    store.upgrade()
    counted: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: counted.append(a[2]))
    for _ in range(2):
        with store.tick_reads():
            store.pending_actions()
            store.pending_actions()
    assert len([s for s in counted if "FROM actions" in s]) == 2  # once a tick
    store.close()


def test_a_racks_drains_are_recorded_in_one_statement_with_their_own_ids(db_url):
    """The tick's drains and resumes are inserted together (one statement, the ids returned in
    the rows' order): each decision gets the id of its own row, on either database."""
    store = Store(db_url)
    store.upgrade()
    rows = [Action(ActionKind.DRAIN, node=f"r{i:02d}", reason=f"why {i}") for i in range(12)]
    rows.append(Action(ActionKind.RESUME, node="r99"))
    inserts: list[str] = []
    event.listen(
        store.engine,
        "before_cursor_execute",
        lambda *a: inserts.append(a[2]) if a[2].lstrip().startswith("INSERT") else None,
    )
    try:
        recorded = record_actions(store, rows, datetime.now(UTC))
        assert len(inserts) == 1
        for r in recorded:
            stored = store.action(r.id)
            assert stored is not None
            assert (stored.kind, stored.node, stored.reason) == (r.kind, r.node, r.reason)
            assert stored.status is ActionStatus.PENDING
    finally:
        store.close()


def test_a_settles_outcomes_and_follow_ups_are_one_statement_with_their_own_ids(db_url):
    """Drains carried out and the requeue_jobs they lead to: the outcomes and the new rows are
    written in one statement, on either database; each outcome lands on its own row (nothing
    else in it changes) and each follow-up gets the id of its own new row."""
    from babysitter.controller.db.tickstore import Outcome, Settled, settle

    store = Store(db_url)
    store.upgrade()
    try:
        now = datetime.now(UTC)
        other = record_actions(store, [Action(ActionKind.DRAIN, node="x", reason="left")], now)
        drains = record_actions(
            store,
            [Action(ActionKind.DRAIN, node=f"r{i}", reason=f"why {i}") for i in range(3)],
            now,
        )
        follow = [
            Action(ActionKind.REQUEUE_JOBS, node=d.node, reason=f"after {d.id}") for d in drains
        ]
        done = [Outcome(d.id, ActionStatus.DONE, f"drained {d.node}") for d in reversed(drains)]
        writes: list[str] = []
        event.listen(
            store.engine,
            "before_cursor_execute",
            lambda *a: writes.append(a[2]) if WRITE.match(a[2]) else None,
        )
        with store.tick_reads():
            store.pending_actions()  # the tick knows the drains' rows
            settle(store, Settled(actions=done, follow_ups=follow), now)
        assert len(writes) == 1, writes
        for d in drains:
            stored = store.action(d.id)
            assert stored is not None and stored.status is ActionStatus.DONE
            assert (stored.node, stored.reason, stored.outcome) == (
                d.node,
                d.reason,
                f"drained {d.node}",
            )
        assert store.action(other[0].id).status is ActionStatus.PENDING
        queued = [a for a in store.actions() if a.kind is ActionKind.REQUEUE_JOBS]
        assert sorted((a.node, a.reason) for a in queued) == [
            (d.node, f"after {d.id}") for d in drains
        ]
        assert all(a.status is ActionStatus.PENDING and a.id > drains[-1].id for a in queued)
    finally:
        store.close()


def test_a_requeue_run_whose_outcomes_are_not_written_requeues_no_job_twice(tmp_path, monkeypatch):
    """A run's requeue outcomes are written when it ends. If that write fails (or the
    controller stops first) the actions still read pending: the next run carries them out
    again, asks Slurm first, and finds the job requeued already (not a second requeue)."""
    import babysitter.controller.loop.act.executor as executor_mod
    from babysitter.controller.db import audit

    store, names, engine = _cluster(tmp_path)
    slurm = engine.slurm
    try:
        ReportWriter(store).write([_report(names[0], datetime.now(UTC), DBE)])
        engine.tick()  # the drain
        engine.tick()  # its requeue_jobs queues the job's requeue
        real = executor_mod.settle

        def lost(store: Store, s: Any, at: datetime) -> None:
            if s.actions:
                raise RuntimeError("database is locked")
            real(store, s, at)

        monkeypatch.setattr(executor_mod, "settle", lost)
        engine.tick()  # the job is requeued in Slurm; its outcome is not written
        (a,) = [a for a in store.actions() if a.kind is ActionKind.REQUEUE]
        assert a.status is ActionStatus.PENDING
        assert slurm.job(1).restart_count == 1
        # not audited as settled while it reads pending
        assert a.id not in {e.action_id for e in audit.entries(store)}
        monkeypatch.setattr(executor_mod, "settle", real)
        engine.tick()
        (a,) = [a for a in store.actions() if a.kind is ActionKind.REQUEUE]
        assert a.status is ActionStatus.SKIPPED, a.outcome
        assert a.id in {e.action_id for e in audit.entries(store)}
        assert slurm.job(1).restart_count == 1  # requeued once
    finally:
        engine.close()
        store.close()
