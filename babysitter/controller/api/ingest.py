"""Ingest: everything between a report's bytes and its commit, beside the writer it feeds.

- `Ingest`, the ingress policy: who may send (from the headers, before the body is read), how
  much body is read, what a well-typed report still may not carry, and handing it over. Used
  by the FastAPI route (every case) and the ASGI fast path (the well-formed, authorised case),
  so both answer alike; both receive it explicitly.
- `ReportWriter`, the batching writer: one thread that writes queued reports in one
  transaction and acknowledges each report only after its commit, so a crash never loses an
  acknowledged report and a retried report is stored once.

The repository (reads, actions, jobs, alerts) is controller/db/store.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError

from babysitter.controller.api.auth import NODE_HEADER, Authenticator, Principal
from babysitter.controller.api.orders import OrderBook
from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store, aware, now, stored_severity
from babysitter.controller.loop.decide.policy import drain_worthy
from babysitter.controller.loop.decide.wake import DrainWake
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.finding import Action, Finding, Severity, job_of, job_owned, no_verdict
from babysitter.report import Report
from babysitter.slurm.base import node_name_problem

log = logging.getLogger(__name__)


# ---- the ingress policy

# Bounds of one report (the body limit comes from controller.max_body_bytes; the number of
# findings is the report model's own, babysitter.report).
MAX_DETAILS_BYTES = 16 * 1024  # per finding, as JSON
MAX_METRICS_BYTES = 64 * 1024
DEFAULT_MAX_BODY = 1 << 20


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, or None."""
    token = header[7:].strip()
    return token if header[:7].lower() == "bearer " and token else None


class StoreUnavailable(Exception):
    pass


class Refused(Exception):
    """A request answered with an error before or instead of storing it."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _suspect(raw: bytes) -> bool:
    """Only these spellings can carry a value the databases refuse: NUL only as the \\u0000
    escape (a raw control character is not JSON), non-finite numbers as NaN/Infinity. Clean
    bodies (all of them, normally) skip the walk; `in` is a memchr scan, a regex with these
    alternatives cost as much as parsing the report. (A number past float range, 1e400, is
    refused by the store's JSON encoder; Ingest.accept then names its field in the 422.)"""
    return b"\\u0000" in raw or b"NaN" in raw or b"Infinity" in raw


def _unstorable(value: Any, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], str] | None:
    """Where `value` holds something neither SQLite's nor Postgres's JSON/text columns keep
    faithfully: NUL, NaN or +-Infinity."""
    if isinstance(value, str):
        return (loc, "NUL characters are not accepted") if "\x00" in value else None
    if isinstance(value, float):
        return None if math.isfinite(value) else (loc, "NaN/Infinity are not accepted")
    if isinstance(value, dict):
        for k, v in value.items():
            if "\x00" in k:
                return ((*loc, k[:40]), "NUL characters are not accepted")
            bad = _unstorable(v, (*loc, k))
            if bad:
                return bad
    elif isinstance(value, list):
        for i, v in enumerate(value):
            bad = _unstorable(v, (*loc, i))
            if bad:
                return bad
    return None


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str))


def report_problems(raw: bytes, body: Report) -> list[dict[str, Any]]:
    """What a well-typed report still may not carry (-> 422), in FastAPI's error shape."""
    errors = _unstorable_values(body) if _suspect(raw) else []
    named = node_name_problem(body.node)  # `ALL` passes the pattern, yet names every node
    if named is not None:
        errors.append(_error(("node",), named))
    if len(raw) > MAX_DETAILS_BYTES:  # else no finding's details can be that big
        for k, f in enumerate(body.findings):
            if f.details and _json_size(f.details) > MAX_DETAILS_BYTES:
                errors.append(
                    _error(("findings", k, "details"), f"larger than {MAX_DETAILS_BYTES} bytes")
                )
                break
    if len(raw) > MAX_METRICS_BYTES and _json_size(body.metrics) > MAX_METRICS_BYTES:
        errors.append(_error(("metrics",), f"larger than {MAX_METRICS_BYTES} bytes"))
    return errors


def _unstorable_values(body: Report) -> list[dict[str, Any]]:
    """The first unstorable value of the findings and of the metrics, as 422 errors."""
    errors: list[dict[str, Any]] = []
    for k, f in enumerate(body.findings):
        bad = _unstorable(f.message, ("findings", k, "message")) or _unstorable(
            f.details, ("findings", k, "details")
        )
        if bad:
            errors.append(_error(bad[0], bad[1]))
            break
    bad = _unstorable(body.metrics, ("metrics",))
    if bad:
        errors.append(_error(bad[0], bad[1]))
    return errors


def _error(loc: tuple[Any, ...], msg: str) -> dict[str, Any]:
    return {"type": "value_error", "loc": ("body", *loc), "msg": msg, "input": None}


class Ingest:
    """Accepting one report: who sends it (from its headers, before the body is read), how
    much body is read, whether the body may be stored, and handing it to the batching writer.
    Shared by the FastAPI route (every case) and the ASGI fast path (the well-formed,
    authorised case), so both answer alike."""

    def __init__(
        self,
        writer: ReportWriter,
        auth: Authenticator,
        metrics: ControllerMetrics,
        max_body: int = DEFAULT_MAX_BODY,
        orders: OrderBook | None = None,
    ) -> None:
        self.orders = orders  # what the answer to a node's report carries for it
        self.writer = writer
        self.auth = auth
        self.metrics = metrics
        self.max_body = max_body
        self._new = metrics.reports.labels("new")
        self._duplicate = metrics.reports.labels("duplicate")

    def sender(
        self, authorization: str | None, node: str | None, content_length: str | None
    ) -> Principal:
        """Check a report's headers; raises Refused (401/403/413) without touching the body."""
        token = bearer_token(authorization or "")
        if token is None:
            raise Refused(401, "missing bearer token")
        p = self.auth.sender(token, node)
        if p is None:
            raise Refused(
                403,
                f"token not valid for node {node[:64]}"
                if node
                else f"token not valid (a node names itself in {NODE_HEADER})",
            )
        if p.role == "read":
            raise Refused(403, "read token cannot report")
        if content_length is not None:
            try:
                declared = int(content_length)
            except ValueError:
                raise Refused(400, "bad content-length") from None
            if declared > self.max_body:
                raise Refused(413, self.too_large)
        return p

    def count_refused(self, status: int) -> None:
        """A report answered with an error (either door: the route or the fast path)."""
        self.metrics.reports_refused.labels(str(status)).inc()

    @property
    def too_large(self) -> str:
        return f"report body larger than {self.max_body} bytes"

    def refusal(self, sender: Principal, body: Report) -> str | None:
        """Why this sender may not send this report (-> 403), or None."""
        if sender.role == "node" and sender.node != body.node:
            # a valid token of another node: refused for this node
            return f"token not valid for node {body.node}"
        return None

    async def accept(self, body: Report) -> tuple[int, bytes]:
        """Store the report; (202, body) when new, (200, body) for a duplicate, after commit.
        Raises Refused(422) when the database refuses this report alone."""
        start = time.perf_counter()
        report_id = str(body.report_id)
        fut = self.writer.submit_async(body)
        try:
            async with asyncio.timeout(30):
                new = await fut
        except ReportRejected as exc:
            # a number past float range (1e400) parses as infinity without the spelling
            # report_problems looks for: found here, off the hot path, to name the field
            named = _unstorable_values(body)
            if not named:
                # the database's own text (SQL, parameters) stays in our log, not the answer
                log.warning(
                    "report %s from %s refused by the database: %s", report_id, body.node, exc
                )
            raise Refused(
                422, named or [_error((), "the database refused it (see the controller's log)")]
            ) from None
        except Exception as exc:
            log.warning("report %s from %s not stored: %r", report_id, body.node, exc)
            raise StoreUnavailable(f"store unavailable ({type(exc).__name__})") from None
        self.metrics.ingest_latency.observe(time.perf_counter() - start)
        (self._new if new else self._duplicate).inc()
        if new:
            self.auth.learn((body.node,))
            if body.metrics.get("spool_replayed"):
                self.metrics.spool_replayed.inc()
        payload = b'{"report_id":"%s","stored":%s%s}' % (
            report_id.encode(),
            b"true" if new else b"false",
            self.orders.answer_part(body.node) if self.orders is not None else b"",
        )
        return (202 if new else 200), payload


# ---- the batching writer


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


class ReportWriter:
    """The batching writer of reports into the store's database."""

    def __init__(
        self,
        store: Store,
        batch_max: int = 500,
        max_open_findings: int = MAX_OPEN_FINDINGS,
        wake: DrainWake | None = None,
    ) -> None:
        self.engine = store.engine
        self.wake = wake  # told of each committed batch: a new fault wakes the policy loop
        self.batch_max = batch_max
        self.max_open_findings = max_open_findings
        self._insert_report = (
            store.insert(m.reports)
            .on_conflict_do_nothing(index_elements=["report_id"])
            .returning(m.reports.c.report_id)
        )
        self._q: queue.Queue[tuple[Report, asyncio.Future[bool]] | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        self.ingested_batches = 0
        self.split_batches = 0  # batches the database refused, retried report by report

    def start(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="ingest", daemon=True)
            self._writer.start()

    def close(self) -> None:
        """Write what is queued and stop (before the store closes its engine)."""
        if self._writer is not None:
            self._q.put(None)
            self._writer.join(timeout=10)
            self._writer = None

    # ---- ingest
    def submit_async(self, report: Report) -> asyncio.Future[bool]:
        """Queue a report from an event loop; the future resolves to True (new) / False
        (duplicate) after the report's transaction has committed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._q.put((report, fut))
        return fut

    def write(self, batch: Sequence[Report]) -> list[bool]:
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
                outcome = self.write([r for r, _ in batch])
                self.ingested_batches += 1
                if self.wake is not None:
                    self.wake.note(r for r, _ in batch)
            except Exception as exc:
                if len(batch) > 1 and _is_data_error(exc):
                    self._one_by_one(batch)
                    continue
                if _is_data_error(exc):  # one report's value: the client's 422, not our failure
                    log.warning(
                        "report %s of %s refused: %s", batch[0][0].report_id, batch[0][0].node, exc
                    )
                else:
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
                outcome = self.write([item[0]])
                if self.wake is not None:
                    self.wake.note([item[0]])
            except Exception as exc:
                log.warning("report %s of %s refused: %s", item[0].report_id, item[0].node, exc)
                outcome = _rejected(exc) if _is_data_error(exc) else IngestError(str(exc))
            _resolve([item], outcome)
        self.ingested_batches += 1

    def _ingest(self, conn: Connection, batch: Sequence[Report]) -> list[bool]:
        received = now()
        ids = [str(r.report_id) for r in batch]  # the column is text; the model's is a UUID
        seen: dict[str, int] = {}
        unique: list[tuple[str, Report]] = []
        for rid, r in zip(ids, batch, strict=True):
            if rid not in seen:
                seen[rid] = len(unique)
                unique.append((rid, r))
        rows = [
            {
                "report_id": rid,
                "node": r.node,
                "kind": r.kind,
                "sent_at": r.sent_at,
                "received_at": received,
                "n_findings": len(r.findings),
                "worst_severity": str(_worst(r.findings)),
                "metrics": r.metrics or None,
            }
            for rid, r in unique
        ]
        # executemany of one cached statement (SQLAlchemy batches it into multi-row INSERTs
        # with RETURNING itself); a .values(rows) statement would be compiled anew per batch
        new_ids = {row[0] for row in conn.execute(self._insert_report, rows)}
        new_reports = [(rid, r) for rid, r in unique if rid in new_ids]
        frows = [
            {
                "report_id": rid,
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
            for rid, r in new_reports
            for f in r.findings
            if f.severity is not Severity.OK  # ok findings only move node state, not history
        ]
        if frows:
            conn.execute(m.findings.insert(), frows)
        self._update_nodes(conn, sorted(new_reports, key=lambda t: t[1].sent_at), received)
        first_time: set[str] = set()
        out = []
        for rid in ids:
            is_new = rid in new_ids and rid not in first_time
            first_time.add(rid)
            out.append(is_new)
        return out

    def _update_nodes(
        self, conn: Connection, reports: list[tuple[str, Report]], received: datetime
    ) -> None:
        """Fold a batch of reports into node state with two executemany statements (one
        INSERT for nodes seen the first time, one UPDATE), not one statement per node.
        State only moves forward: a report sent before the node's newest applied one (a spool
        replay, a late retry) stays in the history but changes nothing and is not counted as
        clean; it still shows the agent is alive."""
        if not reports:
            return
        names = sorted({r.node for _, r in reports})
        existing = _read_nodes(conn, names, reports)
        _insert_new_nodes(conn, [n for n in names if n not in existing], existing, received)
        applied: set[str] = set()
        for rid, r in reports:  # in order of sending: each moves its node's state forward
            if self._fold_report(existing[r.node], rid, r, received):
                applied.add(r.node)
        _write_nodes(conn, names, existing, applied, received)

    def _fold_report(self, node: dict[str, Any], rid: str, r: Report, received: datetime) -> bool:
        """Apply one report to its node's state (in place); False for a report older than the
        state, which changes nothing."""
        # a clock ahead of the controller's must not freeze the node's state
        at = min(aware(r.sent_at) or received, received)
        last = aware(node.get("last_sent_at"))
        if last is not None and at < last:
            return False
        problems = [f.to_json_dict() for f in r.findings if f.severity in _PROBLEM]
        # a report is clean for the resume when nothing in it would drain the node: a warning
        # (an application's XID, kept until the next reboot) or a job's own log line stays an
        # open finding, but must not keep a node drained for a fault that is gone for good.
        # A crashed check or an unreadable source (no_verdict) is unknown, never clean: it
        # breaks the streak, so a resume needs that many clean reports after it
        node_clean = not any(drain_worthy(f) or no_verdict(f) for f in r.findings)
        if r.kind == "event":
            keys = {(f["check"], f["component"], f["code"]) for f in problems}
            kept = [
                f
                for f in node["open_findings"] or []
                if (f["check"], f["component"], f["code"]) not in keys
            ]
            open_f = kept + problems
            clean = node["consecutive_clean"] if node_clean else 0
        else:
            open_f = problems
            clean = (node["consecutive_clean"] or 0) + 1 if node_clean else 0
        if len(open_f) > self.max_open_findings:
            open_f = _fold(open_f, self.max_open_findings, received)
        worst = max(
            (stored_severity(f["severity"]) for f in open_f),
            default=Severity.OK,
            key=_RANK.__getitem__,
        )
        node.update(
            open_findings=open_f,
            consecutive_clean=clean,
            worst_severity=str(worst),
            last_report_id=rid,
            last_sent_at=at,
            metrics=r.metrics or node.get("metrics"),
        )
        return True


def _read_nodes(
    conn: Connection, names: list[str], reports: list[tuple[str, Report]]
) -> dict[str, dict[str, Any]]:
    """The stored state of the batch's nodes that exist, by name."""
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
        {r.node for _, r in reports if r.kind == "event" or not r.metrics} & existing.keys()
    )
    if keep:
        for row in conn.execute(
            select(m.nodes.c.name, m.nodes.c.open_findings, m.nodes.c.metrics).where(
                m.nodes.c.name.in_(keep)
            )
        ):
            existing[row.name].update(open_findings=row.open_findings, metrics=row.metrics)
    return existing


def _insert_new_nodes(
    conn: Connection, new_names: list[str], existing: dict[str, dict[str, Any]], received: datetime
) -> None:
    """Rows for nodes seen the first time, and their empty state in `existing`."""
    if not new_names:
        return
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


def _write_nodes(
    conn: Connection,
    names: list[str],
    existing: dict[str, dict[str, Any]],
    applied: set[str],
    received: datetime,
) -> None:
    """The new state of nodes a report moved; only liveness for the others."""
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
        conn.execute(NODE_ALIVE_UPDATE, [{"b_name": n, "last_report_at": received} for n in stale])


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
    """Keep the most severe (then node-owned, then newest) open findings and count the rest in
    one summary per owner, so a node that sends ever new finding keys cannot grow its state
    without bound: the node's own evidence on `host`, where the worst severity survives (a
    folded critical still drains), and evidence from jobs' own output on a `job:` component,
    job-owned like what it counts (`job_owned`: a job writing hundreds of log lines never
    drains its nodes through the fold)."""
    prior: list[dict[str, Any]] = []
    plain: list[dict[str, Any]] = []
    for f in open_f:
        is_summary = f.get("code") == FOLDED_CODE and f.get("check") == "babysitter.ingest"
        (prior if is_summary else plain).append(f)
    plain.sort(
        key=lambda f: (
            _RANK[stored_severity(f["severity"])],
            not job_owned(f),
            str(f["observed_at"]),
        ),
        reverse=True,
    )
    rest = plain[cap - 1 :]
    if len({job_owned(f) for f in [*prior, *rest]}) > 1:
        rest = plain[max(cap - 2, 0) :]  # a summary each: one place less for what is kept
    kept = plain[: len(plain) - len(rest)]
    summaries = []
    for jobs in (False, True):
        old = [f for f in prior if job_owned(f) is jobs]
        new = [f for f in rest if job_owned(f) is jobs]
        if old or new:
            summaries.append(_summary(old, new, at, jobs))
    return [*kept, *summaries]


def _summary(
    prior: list[dict[str, Any]], rest: list[dict[str, Any]], at: datetime, jobs: bool
) -> dict[str, Any]:
    """One owner's fold: the findings `rest` and earlier summaries `prior` counted in one."""
    folded, codes, job_ids = len(rest), {str(f["code"]) for f in rest}, set[str]()
    sev = Severity.WARNING
    for f in prior:
        d = f.get("details") or {}
        folded += int(d.get("folded", 0))
        codes.update(str(c) for c in d.get("codes", []))
        job_ids.update(str(j) for j in d.get("jobs", []))
    for f in [*prior, *rest]:
        sev = max(sev, stored_severity(f["severity"]), key=_RANK.__getitem__)
    if not jobs:
        return Finding(
            check="babysitter.ingest",
            component="host",
            severity=sev,
            code=FOLDED_CODE,
            message=f"{folded} more open findings than the controller keeps per node (worst {sev})",
            action=Action.INSPECT,
            observed_at=at,
            details={"folded": folded, "codes": sorted(codes)[:20]},
        ).to_json_dict()
    job_ids.update(job_of(f) for f in rest)
    job = next(iter(job_ids)) if len(job_ids) == 1 else "several"
    return Finding(
        check="babysitter.ingest",
        component=f"job:{job}",
        severity=sev,
        code=FOLDED_CODE,
        message=f"{folded} more open findings from jobs' own output than the controller keeps "
        f"per node (worst {sev}; never a drain on its own)",
        action=Action.INSPECT,
        observed_at=at,
        details={
            "folded": folded,
            "codes": sorted(codes)[:20],
            "jobs": sorted(job_ids)[:20],
            "job_id": job,
        },
    ).to_json_dict()


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
