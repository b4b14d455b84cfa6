"""The store (the repository): SQLite (WAL) by default, Postgres via psycopg 3. Rows are read
back as the controller's types at this boundary (stored_severity, stored_finding). Reports
come in through the batching writer in controller/api/ingest.py."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypedDict, TypeVar, cast

from sqlalchemy import (
    Connection,
    Engine,
    RowMapping,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    select,
    update,
)

from babysitter.controller.db import models as m
from babysitter.controller.db.action_view import after_update, listing_patch
from babysitter.controller.db.actions import Action as Recorded
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.kv_view import json_text, kv_patch, kv_row
from babysitter.controller.db.tick_reads import TickReads
from babysitter.controller.db.upsert import clamped, dialect_insert, upsert, upsert_many
from babysitter.finding import Action, Finding, Severity
from babysitter.job import BabysitSpec

log = logging.getLogger(__name__)


def now() -> datetime:
    return datetime.now(UTC)


def aware(dt: datetime | None) -> datetime | None:
    """SQLite hands datetimes back naive; everything here is UTC."""
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


# NaN/Infinity are not JSON: Postgres refuses them, SQLite would keep text no JSON reader takes.
# Refused when the value is bound (a data error: that report alone is refused, see _write_loop).
PENDING_LISTING = 5000  # the newest pending actions a step looks through
_json = json_text  # the kv table's JSON, as kv_view.py reads it back


_SEVERITIES = {str(s): s for s in Severity}
_ACTIONS = {str(a): a for a in Action}
_KINDS = {str(k): k for k in ActionKind}
_STATUSES = {str(s): s for s in ActionStatus}
_unreadable_logged: set[str] = set()
E = TypeVar("E", bound=StrEnum)


def _stored(value: object, table: Mapping[str, E], fallback: E, what: str) -> E:
    """A word read back from the database as its enum; one nobody here reads is logged (once
    per value) and read as `fallback`, the fail-closed reading of that column."""
    got = table.get(value) if isinstance(value, str) else None
    if got is None:
        _unreadable(f"{what} {value!r}", fallback)
        return fallback
    return got


def stored_severity(value: object) -> Severity:
    """A severity read back from the database, as the enum. Only ingest writes it (from a
    validated Finding), so anything else was written by hand or by a broken version: it is
    logged (once per value) and read as WARNING, never as ok. A health daemon must not
    call a node healthy because of a word it cannot read, and must not drain it for one
    either: WARNING makes the node suspect, shown as such, not drained."""
    return _stored(value, _SEVERITIES, Severity.WARNING, "severity")


def stored_action(value: object) -> Action:
    """A recommended action read back from the database; unknown ones read as INSPECT (logged)."""
    return _stored(value, _ACTIONS, Action.INSPECT, "action")


def stored_kind(value: object) -> ActionKind:
    """An action's kind read back from the database; an unknown one reads as UNKNOWN (logged),
    which the executor never carries out: a pending one fails, it counts as no drain."""
    return _stored(value, _KINDS, ActionKind.UNKNOWN, "action kind")


def stored_status(value: object) -> ActionStatus:
    """An action's status read back; an unknown one reads as FAILED (logged), as the audit
    log reads it: never as done, and never run again."""
    return _stored(value, _STATUSES, ActionStatus.FAILED, "action status")


def stored_action_row(r: RowMapping) -> Recorded:
    """A row of the actions table as an `Action`: its enums read as stored_kind/stored_status
    say, its datetimes aware."""
    return Recorded(
        id=int(r["id"]),
        kind=stored_kind(r["kind"]),
        node=r["node"],
        job_id=r["job_id"],
        reason=r["reason"],
        rule=r["rule"],
        requested_by=str(r["requested_by"]),
        status=stored_status(r["status"]),
        outcome=r["outcome"],
        dry_run=bool(r["dry_run"]),
        attempts=int(r["attempts"] or 0),
        created_at=aware(r["created_at"]),
        done_at=aware(r["done_at"]),
        next_attempt_at=aware(r["next_attempt_at"]),
    )


def _unreadable(what: str, read_as: str) -> None:
    if what not in _unreadable_logged and len(_unreadable_logged) < 100:
        _unreadable_logged.add(what)
        log.error("unknown %s in the database: read as %s", what, read_as)


def stored_finding(d: dict[str, Any]) -> Finding:
    """An open finding as stored in a node's row (Finding.to_json_dict, written by ingest),
    back as a Finding. One that no longer validates (a severity or action nobody can read,
    written by hand or by another version) is still read, with its enums mapped as
    stored_severity/stored_action say, rather than dropped or ranked ok."""
    try:
        return Finding.from_dict(d)  # the common case
    except ValueError:
        pass
    observed = d.get("observed_at")
    try:
        when = datetime.fromisoformat(observed) if isinstance(observed, str) else None
    except ValueError:
        when = None
    details = d.get("details")
    return Finding.unchecked(
        check=str(d.get("check", "")),
        component=str(d.get("component", "")),
        severity=stored_severity(d.get("severity")),
        code=str(d.get("code", "")),
        message=str(d.get("message", "")),
        action=stored_action(d.get("action", "none")),
        observed_at=aware(when) or now(),
        details=details if isinstance(details, dict) else {},
    )


class HistoryEntry(TypedDict, total=False):
    """One entry of a job's history (jobs.history, JSON): what babysitter did or hit."""

    event: str  # requeue | held | error | requeue_held | requeue_released | nccl_failure
    at: str  # ISO time
    until: str  # requeue_held: the end of the link grace (ISO time)
    restart_count: int
    why: str
    error: str
    excluded: list[str]
    resume_point: str | None
    checkpoint: str
    message: str  # nccl_failure: the job's log line (one failure, one requeue: nccl_requeue.py)
    outcome: str  # nccl_failure: what babysitter did about it


class JobRow(TypedDict, total=False):
    """A row of the jobs table, as the repository hands it out."""

    job_id: int
    name: str | None
    user: str | None
    nodes: list[str]
    state: str | None
    babysit: BabysitSpec
    restart_count: int
    requeues: int
    resume_point: str | None
    history: list[HistoryEntry]
    first_seen_at: datetime | None
    updated_at: datetime | None


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"timeout": 30, "check_same_thread": False},
            json_serializer=_json,
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable at checkpoint
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=5,
        max_overflow=5,
        pool_timeout=10,
        connect_args={"connect_timeout": 5},
        json_serializer=_json,
    )


def _insert(engine: Engine) -> Any:
    return dialect_insert(engine.dialect.name)


# the tick's frequent statements, built once (building them was most of their cost)
_NEWEST_ACTIONS = select(m.actions).order_by(m.actions.c.id.desc()).limit(bindparam("limit"))
_NEWEST_ACTIONS_BY_STATUS = (
    select(m.actions)
    .where(m.actions.c.status == bindparam("status"))
    .order_by(m.actions.c.id.desc())
    .limit(bindparam("limit"))
)
_FIRING = select(m.alerts).where(m.alerts.c.state == "firing")
_KV_ONE = select(m.kv.c.value).where(m.kv.c.key == bindparam("key"))
_KV_ALL = select(m.kv.c.key, m.kv.c.value)
_UPDATE_NODES: dict[tuple[str, ...], Any] = {}


class Store:
    """The repository: nodes, findings, actions, jobs, alerts and kv, read and written in
    the controller's own terms (severities as `Severity`, open findings as `Finding`). Reports
    are written by the batching writer (controller/api/ingest.py), not here."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.insert = _insert(self.engine)
        self.reads = TickReads(self.engine)  # the tick reads each table once (tick_reads.py)

    # ---- lifecycle
    def upgrade(self) -> None:
        from babysitter.controller.db.migrations import upgrade

        upgrade(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> bool:
        try:
            with self.engine.connect() as c:  # a fresh one: ping tests the database
                c.execute(select(1))
            return True
        except Exception:
            return False

    # ---- reads
    def node_rows(self) -> list[dict[str, Any]]:
        with self.reading() as c:
            return [
                self._node(r._asdict()) for r in c.execute(select(m.nodes).order_by(m.nodes.c.name))
            ]

    def node(self, name: str) -> dict[str, Any] | None:
        with self.reading() as c:
            row = c.execute(select(m.nodes).where(m.nodes.c.name == name)).first()
        return self._node(row._asdict()) if row else None

    @staticmethod
    def _node(d: dict[str, Any]) -> dict[str, Any]:
        """A node row with its types restored: aware datetimes, open findings as `Finding`s,
        the worst severity as `Severity`."""
        for k in ("first_seen_at", "last_report_at", "drained_at"):
            d[k] = aware(d.get(k))
        d["open_findings"] = [stored_finding(f) for f in d.get("open_findings") or []]
        d["worst_severity"] = stored_severity(d.get("worst_severity", "ok"))
        return d

    def findings(
        self,
        node: str | None = None,
        since: datetime | None = None,
        severity: Severity | None = None,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        """Finding history, newest first; `severity`: that severity or worse."""
        q = select(m.findings).order_by(m.findings.c.id.desc()).limit(limit)
        if node:
            q = q.where(m.findings.c.node == node)
        if since:
            q = q.where(m.findings.c.observed_at >= since)
        if severity:
            q = q.where(m.findings.c.severity.in_([str(s) for s in Severity if s >= severity]))
        with self.reading() as c:
            rows = [r._asdict() for r in c.execute(q)]
        for r in rows:
            r["observed_at"] = aware(r["observed_at"])
            r["severity"] = stored_severity(r["severity"])
            r["action"] = stored_action(r["action"])
        return rows

    def count(self, table: str) -> int:
        t = m.metadata.tables[table]
        with self.reading() as c:
            return int(c.execute(select(func.count()).select_from(t)).scalar_one())

    def report_ids(self) -> list[str]:
        with self.reading() as c:
            return [r[0] for r in c.execute(select(m.reports.c.report_id))]

    # ---- node state written by the policy loop
    def update_nodes(self, changes: dict[str, dict[str, Any]]) -> None:
        """Many node updates in one transaction (the policy loop writes verdicts for
        thousands of nodes; one statement per column set, executemany)."""
        by_cols: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for name, values in changes.items():
            by_cols.setdefault(tuple(sorted(values)), []).append({"b_name": name, **values})
        with self.engine.begin() as c:
            for cols, rows in by_cols.items():
                stmt = _UPDATE_NODES.get(cols)
                if stmt is None:  # a handful of column sets: each built once
                    stmt = _UPDATE_NODES[cols] = (
                        update(m.nodes)
                        .where(m.nodes.c.name == bindparam("b_name"))
                        .values({col: bindparam(col) for col in cols})
                    )
                c.execute(stmt, rows)

    def set_node(self, name: str, **values: Any) -> None:
        with self.engine.begin() as c:
            c.execute(update(m.nodes).where(m.nodes.c.name == name).values(**values))

    # ---- actions
    def record_action(
        self,
        kind: ActionKind,
        *,
        node: str | None = None,
        job_id: int | None = None,
        reason: str | None = None,
        rule: str | None = None,  # a loop.policy.Rule
        requested_by: str = "policy",
        status: ActionStatus = ActionStatus.PENDING,
        outcome: str | None = None,
        dry_run: bool = False,
    ) -> int:
        a = Recorded(
            kind=kind,
            node=node,
            job_id=job_id,
            reason=reason,
            rule=rule,
            requested_by=requested_by,
            status=status,
            outcome=outcome,
            dry_run=dry_run,
        )
        return self.record(a).id

    def record(self, a: Recorded) -> Recorded:
        """Insert an action (created now; done now unless pending); returns it with its id."""
        a = a.created(now())
        with self.reads.writing("actions") as w, self.engine.begin() as c:
            pk = c.execute(m.actions.insert().values(**a.columns())).inserted_primary_key
            assert pk is not None
            return w.add(a.recorded(int(pk[0])))

    def actions(self, status: str | None = None, limit: int = 1000) -> list[Recorded]:
        """Actions, newest first; `status`: an ActionStatus (another word matches none)."""

        def read() -> list[Recorded]:
            q, params = _NEWEST_ACTIONS, dict[str, Any](limit=limit)
            if status:
                q, params = _NEWEST_ACTIONS_BY_STATUS, {"limit": limit, "status": str(status)}
            with self.reading() as c:
                return [stored_action_row(r._mapping) for r in c.execute(q, params)]

        patch = listing_patch(status, limit)  # the tick's own writes keep it current
        got: list[Recorded] = self.reads.read(("actions",), ("actions", status, limit), read, patch)
        return list(got)

    def action(self, action_id: int) -> Recorded | None:
        """One action by its id, however many came after it."""
        q = select(m.actions).where(m.actions.c.id == action_id)
        with self.reading() as c:
            row = c.execute(q).first()
        return stored_action_row(row._mapping) if row is not None else None

    def pending_actions(self) -> list[Recorded]:
        # the newest 1,000, from the listing the requeue lookup reads (one read for both)
        listing = self.actions(status=ActionStatus.PENDING, limit=PENDING_LISTING)
        return sorted(listing[:1000], key=lambda a: a.id)

    def update_action(self, action_id: int, **values: Any) -> None:
        known = self.reads.known("actions", action_id)
        with self.reads.writing("actions") as w, self.engine.begin() as c:
            c.execute(update(m.actions).where(m.actions.c.id == action_id).values(**values))
            w.add(after_update(known, values))

    # ---- jobs
    def upsert_job(self, job_id: int, **values: Any) -> None:
        ts = now()
        values = clamped(m.jobs, values)
        first = m.new_job_columns(frozenset(values), ts)
        with self.engine.begin() as c:
            upsert(c, m.jobs, {"job_id": job_id}, {**values, "updated_at": ts}, first)

    def jobs(self, job_id: int | None = None) -> list[JobRow]:
        """Every babysat job's row, or the one of `job_id` (a requeue read them all)."""
        q = select(m.jobs).order_by(m.jobs.c.job_id)
        q = q if job_id is None else q.where(m.jobs.c.job_id == job_id)
        with self.reading() as c:
            rows = [r._asdict() for r in c.execute(q)]
        for r in rows:
            r["first_seen_at"] = aware(r["first_seen_at"])
            r["updated_at"] = aware(r["updated_at"])
        return [cast(JobRow, r) for r in rows]

    # ---- alerts
    def upsert_alert(self, key: str, **values: Any) -> None:
        with self.engine.begin() as c:
            upsert(c, m.alerts, {"key": key}, values)

    def upsert_alerts(self, rows: list[tuple[str, dict[str, Any]]]) -> None:
        """upsert_alert of each (key, values), in order, in one transaction."""
        if rows:
            with self.engine.begin() as c:
                upsert_many(c, m.alerts, "key", rows)

    def alerts(self) -> list[dict[str, Any]]:
        with self.reading() as c:
            rows = [r._asdict() for r in c.execute(select(m.alerts))]
        for r in rows:
            r["severity"] = stored_severity(r["severity"])
        return rows

    def firing_alerts(self) -> list[dict[str, Any]]:
        """The alerts firing now. Every tick reads them: resolved rows (one per node|condition
        and job key ever seen) grow for ever and were read and decoded each time (the soak's
        ticks slowed ~3x over five simulated days of job alerts)."""

        def read() -> list[dict[str, Any]]:
            with self.reading() as c:
                rows = [r._asdict() for r in c.execute(_FIRING)]
            for r in rows:
                r["severity"] = stored_severity(r["severity"])
            return rows

        return [dict(r) for r in self.reads.read(("alerts",), ("firing_alerts",), read)]

    # ---- kv
    def kv_get(self, key: str, default: Any = None) -> Any:
        if self.reads.active:  # the tick reads the whole (small) table once
            got = self.reads.read(("kv",), ("kv",), self._kv_all, kv_patch)
            return copy.deepcopy(got.get(key, default))
        with self.reading() as c:
            row = c.execute(_KV_ONE, {"key": key}).first()
        return row[0] if row else default

    def _kv_all(self) -> dict[str, Any]:
        with self.reading() as c:
            return {str(k): v for k, v in c.execute(_KV_ALL)}

    def reading(self) -> AbstractContextManager[Connection]:
        """A connection to read with (the tick's one inside the tick: tick_reads.py)."""
        return self.reads.connection()

    def tick_reads(self) -> AbstractContextManager[None]:
        """The span of one tick: its repeated reads come from memory (tick_reads.py)."""
        return self.reads.tick()

    def kv_set(self, key: str, value: Any) -> None:
        ts, row = now(), kv_row(key, value)  # (the row first: a value JSON cannot hold fails)
        with self.reads.writing("kv") as w, self.engine.begin() as c:
            upsert(c, m.kv, {"key": key}, {"value": value, "updated_at": ts})
            w.add(row)

    # ---- retention
    def prune(self, older_than_days: float) -> int:
        cutoff = now() - timedelta(days=older_than_days)
        with self.engine.begin() as c:
            old = select(m.reports.c.report_id).where(m.reports.c.received_at < cutoff)
            c.execute(delete(m.findings).where(m.findings.c.report_id.in_(old)))
            res = c.execute(delete(m.reports).where(m.reports.c.received_at < cutoff))
            return int(res.rowcount or 0)
