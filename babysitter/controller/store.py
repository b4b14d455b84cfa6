"""The store: SQLite (WAL) by default, Postgres via psycopg 3. Ingest goes through one writer
thread that batches reports into one transaction and acknowledges each report only after its
commit, so a crash never loses an acknowledged report and a retried report is stored once."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Engine,
    String,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError

from babysitter.controller import models as m
from babysitter.controller.wake import DrainWake
from babysitter.finding import Action, Finding, Severity

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
_json = functools.partial(json.dumps, allow_nan=False)


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
    from sqlalchemy.dialects import postgresql, sqlite

    return postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert


@dataclass
class Report:
    node: str
    report_id: str
    sent_at: datetime
    findings: list[Finding]
    metrics: dict[str, Any]
    kind: str = "full"  # "event": pushed at once by an event source, merges into open findings


class IngestError(Exception):
    pass


class ReportRejected(IngestError):
    """The database refused this report itself (a value it cannot store), not the batch."""


# Errors that belong to the data of a statement, not to the database being away: retrying
# the same report cannot help, the other reports of its batch are fine.
_DATA_ERRORS = (DataError, IntegrityError, ValueError, TypeError)

# The open findings a node keeps at most; the rest fold into one finding that counts them.
MAX_OPEN_FINDINGS = 256
FOLDED_CODE = "ingest.findings_folded"


def _resolve(
    batch: Sequence[tuple[Report, asyncio.Future[bool]]], outcome: list[bool] | BaseException
) -> None:
    """Settle a batch's futures from the writer thread: one call_soon_threadsafe per event loop
    (one wake-up per batch, not one per report)."""
    per_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[bool], int]]] = {}
    for k, (_, fut) in enumerate(batch):
        per_loop.setdefault(fut.get_loop(), []).append((fut, k))
    for loop, futs in per_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, futs, outcome)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass


def _settle(
    futs: list[tuple[asyncio.Future[bool], int]], outcome: list[bool] | BaseException
) -> None:
    for fut, k in futs:
        if fut.done():  # the request timed out or its client went away
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome[k])


class Store:
    def __init__(
        self,
        url: str,
        batch_max: int = 500,
        max_open_findings: int = MAX_OPEN_FINDINGS,
        wake: DrainWake | None = None,
    ) -> None:
        self.url = url
        self.wake = wake  # told of each committed batch: a new fault wakes the policy loop
        self.engine = make_engine(url)
        self.insert = _insert(self.engine)
        self.batch_max = batch_max
        self.max_open_findings = max_open_findings
        self._insert_report = (
            self.insert(m.reports)
            .on_conflict_do_nothing(index_elements=["report_id"])
            .returning(m.reports.c.report_id)
        )
        self._q: queue.Queue[tuple[Report, asyncio.Future[bool]] | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        self.ingested_batches = 0
        self.split_batches = 0  # batches the database refused, retried report by report

    # ---- lifecycle
    def upgrade(self) -> None:
        from babysitter.controller.migrations import upgrade

        upgrade(self.engine)

    def start(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="ingest", daemon=True)
            self._writer.start()

    def close(self) -> None:
        if self._writer is not None:
            self._q.put(None)
            self._writer.join(timeout=10)
            self._writer = None
        self.engine.dispose()

    def ping(self) -> bool:
        try:
            with self.engine.connect() as c:
                c.execute(select(1))
            return True
        except Exception:
            return False

    # ---- ingest
    def submit_async(self, report: Report) -> asyncio.Future[bool]:
        """Queue a report from an event loop; the future resolves to True (new) / False
        (duplicate) after the report's transaction has committed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._q.put((report, fut))
        return fut

    def ingest(self, batch: Sequence[Report]) -> list[bool]:
        """Write reports in one transaction; returns new/duplicate per report."""
        with self.engine.begin() as conn:
            return self._ingest(conn, batch)

    def _write_loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            batch = [item]
            deadline = time.monotonic() + 0.002  # a couple of ms to let a batch form
            while len(batch) < self.batch_max:
                try:
                    nxt = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)
                    break
                batch.append(nxt)
            outcome: list[bool] | BaseException
            try:
                outcome = self.ingest([r for r, _ in batch])
                self.ingested_batches += 1
                if self.wake is not None:
                    self.wake.note(r for r, _ in batch)
            except Exception as exc:
                if len(batch) > 1 and _is_data_error(exc):
                    self._one_by_one(batch)
                    continue
                log.exception("ingest batch of %d failed", len(batch))
                outcome = _rejected(exc) if _is_data_error(exc) else IngestError(str(exc))
            _resolve(batch, outcome)

    def _one_by_one(self, batch: Sequence[tuple[Report, asyncio.Future[bool]]]) -> None:
        """A batch the database refused for its data: one bad report must not fail the
        others, so each is written in its own transaction and answered on its own."""
        self.split_batches += 1
        for item in batch:
            outcome: list[bool] | BaseException
            try:
                outcome = self.ingest([item[0]])
                if self.wake is not None:
                    self.wake.note([item[0]])
            except Exception as exc:
                log.warning("report %s of %s refused: %s", item[0].report_id, item[0].node, exc)
                outcome = _rejected(exc) if _is_data_error(exc) else IngestError(str(exc))
            _resolve([item], outcome)
        self.ingested_batches += 1

    def _ingest(self, conn: Connection, batch: Sequence[Report]) -> list[bool]:
        received = now()
        seen: dict[str, int] = {}
        unique: list[Report] = []
        for r in batch:
            if r.report_id not in seen:
                seen[r.report_id] = len(unique)
                unique.append(r)
        rows = [
            {
                "report_id": r.report_id,
                "node": r.node,
                "kind": r.kind,
                "sent_at": r.sent_at,
                "received_at": received,
                "n_findings": len(r.findings),
                "worst_severity": str(_worst(r.findings)),
                "metrics": r.metrics or None,
            }
            for r in unique
        ]
        # executemany of one cached statement (SQLAlchemy batches it into multi-row INSERTs
        # with RETURNING itself); a .values(rows) statement would be compiled anew per batch
        new_ids = {row[0] for row in conn.execute(self._insert_report, rows)}
        new_reports = [r for r in unique if r.report_id in new_ids]
        frows = [
            {
                "report_id": r.report_id,
                "node": r.node,
                "check": f.check,
                "component": f.component,
                "severity": str(f.severity),
                "code": f.code,
                "message": f.message,
                "action": str(f.action),
                "observed_at": f.observed_at,
                "details": f.details or None,
            }
            for r in new_reports
            for f in r.findings
            if f.severity is not Severity.OK  # ok findings only move node state, not history
        ]
        if frows:
            conn.execute(m.findings.insert(), frows)
        self._update_nodes(conn, sorted(new_reports, key=lambda r: r.sent_at), received)
        first_time: set[str] = set()
        out = []
        for r in batch:
            is_new = r.report_id in new_ids and r.report_id not in first_time
            first_time.add(r.report_id)
            out.append(is_new)
        return out

    def _update_nodes(self, conn: Connection, reports: list[Report], received: datetime) -> None:
        """Fold a batch of reports into node state with two executemany statements (one
        INSERT for nodes seen the first time, one UPDATE), not one statement per node.
        State only moves forward: a report sent before the node's newest applied one (a spool
        replay, a late retry) stays in the history but changes nothing and is not counted as
        clean; it still shows the agent is alive."""
        if not reports:
            return
        names = sorted({r.node for r in reports})
        existing = {
            row.name: row._asdict()
            for row in conn.execute(
                select(
                    m.nodes.c.name,
                    m.nodes.c.consecutive_clean,
                    m.nodes.c.last_sent_at,
                    m.nodes.c.last_report_id,
                ).where(m.nodes.c.name.in_(names))
            )
        }
        # The stored JSON is only needed where it survives the batch: open findings under an
        # event report (merged, not replaced) and metrics under a report without any. Reading
        # and decoding it for every node was a fifth of the writer's time.
        keep = sorted(
            {r.node for r in reports if r.kind == "event" or not r.metrics} & existing.keys()
        )
        if keep:
            for row in conn.execute(
                select(m.nodes.c.name, m.nodes.c.open_findings, m.nodes.c.metrics).where(
                    m.nodes.c.name.in_(keep)
                )
            ):
                existing[row.name].update(open_findings=row.open_findings, metrics=row.metrics)
        new_names = [n for n in names if n not in existing]
        if new_names:
            conn.execute(
                m.nodes.insert(),
                [
                    {
                        "name": n,
                        "first_seen_at": received,
                        "open_findings": [],
                        "consecutive_clean": 0,
                        "worst_severity": "ok",
                        "verdict": "unknown",
                        "babysitter_drained": False,
                    }
                    for n in new_names
                ],
            )
            for n in new_names:
                existing[n] = {
                    "name": n,
                    "open_findings": [],
                    "consecutive_clean": 0,
                    "metrics": None,
                    "last_sent_at": None,
                }
        applied: set[str] = set()
        for r in reports:
            node = existing[r.node]
            # a clock ahead of the controller's must not freeze the node's state
            at = min(aware(r.sent_at) or received, received)
            last = aware(node.get("last_sent_at"))
            if last is not None and at < last:
                continue
            applied.add(r.node)
            problems = [f.to_json_dict() for f in r.findings if f.severity in _PROBLEM]
            if r.kind == "event":
                keys = {(f["check"], f["component"], f["code"]) for f in problems}
                kept = [
                    f
                    for f in node["open_findings"] or []
                    if (f["check"], f["component"], f["code"]) not in keys
                ]
                open_f = kept + problems
                clean = 0 if problems else node["consecutive_clean"]
            else:
                open_f = problems
                clean = 0 if problems else (node["consecutive_clean"] or 0) + 1
            if len(open_f) > self.max_open_findings:
                open_f = _fold(open_f, self.max_open_findings, received)
            worst = max(
                (Severity(f["severity"]) for f in open_f),
                default=Severity.OK,
                key=_RANK.__getitem__,
            )
            node.update(
                open_findings=open_f,
                consecutive_clean=clean,
                worst_severity=str(worst),
                last_report_id=r.report_id,
                last_sent_at=at,
                metrics=r.metrics or node.get("metrics"),
            )
        if applied:
            conn.execute(
                NODE_STATE_UPDATE,
                [
                    {
                        "b_name": n,
                        "open_findings": existing[n]["open_findings"],
                        "consecutive_clean": existing[n]["consecutive_clean"],
                        "worst_severity": existing[n]["worst_severity"],
                        "last_report_at": received,
                        "last_report_id": existing[n]["last_report_id"],
                        "last_sent_at": existing[n]["last_sent_at"],
                        "metrics": existing[n].get("metrics"),
                    }
                    for n in sorted(applied)
                ],
            )
        stale = [n for n in names if n not in applied]
        if stale:
            conn.execute(
                NODE_ALIVE_UPDATE, [{"b_name": n, "last_report_at": received} for n in stale]
            )

    # ---- reads
    def node_rows(self) -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            return [
                self._node(r._asdict()) for r in c.execute(select(m.nodes).order_by(m.nodes.c.name))
            ]

    def node(self, name: str) -> dict[str, Any] | None:
        with self.engine.connect() as c:
            row = c.execute(select(m.nodes).where(m.nodes.c.name == name)).first()
        return self._node(row._asdict()) if row else None

    @staticmethod
    def _node(d: dict[str, Any]) -> dict[str, Any]:
        for k in ("first_seen_at", "last_report_at", "drained_at"):
            d[k] = aware(d.get(k))
        d["open_findings"] = d.get("open_findings") or []
        return d

    def findings(
        self,
        node: str | None = None,
        since: datetime | None = None,
        severity: str | None = None,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        q = select(m.findings).order_by(m.findings.c.id.desc()).limit(limit)
        if node:
            q = q.where(m.findings.c.node == node)
        if since:
            q = q.where(m.findings.c.observed_at >= since)
        if severity:
            order = ["ok", "info", "warning", "critical"]
            q = q.where(m.findings.c.severity.in_(order[order.index(severity) :]))
        with self.engine.connect() as c:
            rows = [r._asdict() for r in c.execute(q)]
        for r in rows:
            r["observed_at"] = aware(r["observed_at"])
        return rows

    def count(self, table: str) -> int:
        t = m.metadata.tables[table]
        with self.engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(t)).scalar_one())

    def report_ids(self) -> list[str]:
        with self.engine.connect() as c:
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
                stmt = (
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
        kind: str,
        *,
        node: str | None = None,
        job_id: int | None = None,
        reason: str | None = None,
        rule: str | None = None,
        requested_by: str = "policy",
        status: str = "pending",
        outcome: str | None = None,
        dry_run: bool = False,
    ) -> int:
        ts = now()
        with self.engine.begin() as c:
            res = c.execute(
                m.actions.insert().values(
                    kind=kind,
                    node=node,
                    job_id=job_id,
                    reason=reason,
                    rule=rule,
                    requested_by=requested_by,
                    status=status,
                    outcome=outcome,
                    dry_run=dry_run,
                    attempts=0,
                    created_at=ts,
                    done_at=ts if status != "pending" else None,
                    next_attempt_at=ts,
                )
            )
            pk = res.inserted_primary_key
            assert pk is not None
            return int(pk[0])

    def actions(self, status: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        q = select(m.actions).order_by(m.actions.c.id.desc()).limit(limit)
        if status:
            q = q.where(m.actions.c.status == status)
        with self.engine.connect() as c:
            rows = [r._asdict() for r in c.execute(q)]
        for r in rows:
            for k in ("created_at", "done_at", "next_attempt_at"):
                r[k] = aware(r[k])
        return rows

    def pending_actions(self) -> list[dict[str, Any]]:
        return sorted(self.actions(status="pending"), key=lambda a: a["id"])

    def update_action(self, action_id: int, **values: Any) -> None:
        with self.engine.begin() as c:
            c.execute(update(m.actions).where(m.actions.c.id == action_id).values(**values))

    # ---- jobs
    def upsert_job(self, job_id: int, **values: Any) -> None:
        ts = now()
        values = _clamped(m.jobs, values)
        with self.engine.begin() as c:
            exists = c.execute(select(m.jobs.c.job_id).where(m.jobs.c.job_id == job_id)).first()
            if exists:
                c.execute(
                    update(m.jobs).where(m.jobs.c.job_id == job_id).values(**values, updated_at=ts)
                )
            else:
                values.setdefault("babysit", {})
                c.execute(
                    m.jobs.insert().values(job_id=job_id, first_seen_at=ts, updated_at=ts, **values)
                )

    def jobs(self) -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            rows = [r._asdict() for r in c.execute(select(m.jobs).order_by(m.jobs.c.job_id))]
        for r in rows:
            r["first_seen_at"] = aware(r["first_seen_at"])
            r["updated_at"] = aware(r["updated_at"])
        return rows

    # ---- alerts
    def upsert_alert(self, key: str, **values: Any) -> None:
        with self.engine.begin() as c:
            if c.execute(select(m.alerts.c.key).where(m.alerts.c.key == key)).first():
                c.execute(update(m.alerts).where(m.alerts.c.key == key).values(**values))
            else:
                c.execute(m.alerts.insert().values(key=key, **values))

    def alerts(self) -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            return [r._asdict() for r in c.execute(select(m.alerts))]

    # ---- kv
    def kv_get(self, key: str, default: Any = None) -> Any:
        with self.engine.connect() as c:
            row = c.execute(select(m.kv.c.value).where(m.kv.c.key == key)).first()
        return row[0] if row else default

    def kv_set(self, key: str, value: Any) -> None:
        ts = now()
        with self.engine.begin() as c:
            if c.execute(select(m.kv.c.key).where(m.kv.c.key == key)).first():
                c.execute(update(m.kv).where(m.kv.c.key == key).values(value=value, updated_at=ts))
            else:
                c.execute(m.kv.insert().values(key=key, value=value, updated_at=ts))

    # ---- retention
    def prune(self, older_than_days: float) -> int:
        cutoff = now() - timedelta(days=older_than_days)
        with self.engine.begin() as c:
            old = select(m.reports.c.report_id).where(m.reports.c.received_at < cutoff)
            c.execute(delete(m.findings).where(m.findings.c.report_id.in_(old)))
            res = c.execute(delete(m.reports).where(m.reports.c.received_at < cutoff))
            return int(res.rowcount or 0)


# What one report changes in its node's row (executemany, keyed by b_name).
NODE_STATE_UPDATE = (
    update(m.nodes)
    .where(m.nodes.c.name == bindparam("b_name"))
    .values(
        open_findings=bindparam("open_findings"),
        consecutive_clean=bindparam("consecutive_clean"),
        worst_severity=bindparam("worst_severity"),
        last_report_at=bindparam("last_report_at"),
        last_report_id=bindparam("last_report_id"),
        last_sent_at=bindparam("last_sent_at"),
        metrics=bindparam("metrics"),
    )
)
# A report that is older than the node's state: only the node's liveness moves.
NODE_ALIVE_UPDATE = (
    update(m.nodes)
    .where(m.nodes.c.name == bindparam("b_name"))
    .values(last_report_at=bindparam("last_report_at"))
)

# plain dict lookups: Severity's rich comparisons are Python calls, ~10 per report on ingest
_RANK = {s: s.rank for s in Severity}
_PROBLEM = frozenset(s for s in Severity if s > Severity.INFO)


def _worst(findings: Iterable[Finding]) -> Severity:
    return max((f.severity for f in findings), default=Severity.OK, key=_RANK.__getitem__)


def _fold(open_f: list[dict[str, Any]], cap: int, at: datetime) -> list[dict[str, Any]]:
    """Keep the `cap - 1` most severe (then newest) open findings and count the rest in one
    finding: a node that sends ever new finding keys cannot grow its state without bound,
    and the worst severity survives the fold (a folded critical still counts)."""
    folded = 0
    codes: set[str] = set()
    plain = []
    for f in open_f:
        if f.get("code") == FOLDED_CODE and f.get("check") == "babysitter.ingest":
            folded += int((f.get("details") or {}).get("folded", 0))
            codes.update((f.get("details") or {}).get("codes", []))
        else:
            plain.append(f)
    plain.sort(key=lambda f: (_RANK[Severity(f["severity"])], str(f["observed_at"])), reverse=True)
    kept, rest = plain[: cap - 1], plain[cap - 1 :]
    folded += len(rest)
    codes.update(str(f["code"]) for f in rest)
    sev = max(
        (Severity(f["severity"]) for f in rest), default=Severity.WARNING, key=_RANK.__getitem__
    )
    summary = Finding(
        check="babysitter.ingest",
        component="host",
        severity=max(sev, Severity.WARNING, key=_RANK.__getitem__),
        code=FOLDED_CODE,
        message=f"{folded} more open findings than the controller keeps per node (worst {sev})",
        action=Action.INSPECT,
        observed_at=at,
        details={"folded": folded, "codes": sorted(codes)[:20]},
    )
    return [*kept, summary.to_json_dict()]


def _is_data_error(exc: BaseException) -> bool:
    """True for an error in the data of a statement (a value the database refuses), false
    for the database being away or broken."""
    if isinstance(exc, StatementError) and not isinstance(exc, DBAPIError):
        return True  # raised while binding a value (e.g. encoding JSON)
    return isinstance(exc, _DATA_ERRORS)


def _rejected(exc: BaseException) -> ReportRejected:
    """The reason, without the statement and its parameters (they hold the whole report)."""
    orig = getattr(exc, "orig", None) or exc
    return ReportRejected((str(orig).splitlines() or [type(orig).__name__])[0][:200])


def _clamped(table: Any, values: dict[str, Any]) -> dict[str, Any]:
    """Strings cut to their column's width (Postgres refuses longer ones; SQLite would keep
    them): job names, users and states come from users and Slurm."""
    out = dict(values)
    for k, v in values.items():
        col = table.c.get(k)
        width = col.type.length if col is not None and isinstance(col.type, String) else None
        if isinstance(v, str) and width is not None and len(v) > width:
            out[k] = v[:width]
    return out
