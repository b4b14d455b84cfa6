"""The batching writer of reports (`ReportWriter`): one thread that writes queued reports in
one transaction and acknowledges each report only after its commit, so a crash never loses an
acknowledged report and a retried report is stored once. A batch the database refuses for one
report's data is written again report by report.

Who may send a report and what it may carry is ingress.py's (the ingress policy, in front of
this writer); folding a batch into the nodes' state is node_state.py's. The repository (reads,
actions, jobs, alerts) is controller/db/store.py.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError

from babysitter.controller.api.node_state import MAX_OPEN_FINDINGS, fold_reports, worst_severity
from babysitter.controller.db import models as m
from babysitter.controller.db.precompiled import Precompiled
from babysitter.controller.db.store import Store, now
from babysitter.controller.loop.decide.wake import DrainWake
from babysitter.finding import Severity
from babysitter.report import Report

log = logging.getLogger(__name__)


class IngestError(Exception):
    pass


class ReportRejected(IngestError):
    """The database refused this report itself (a value it cannot store), not the batch."""


# Errors that belong to the data of a statement, not to the database being away: retrying
# the same report cannot help, the other reports of its batch are fine.
_DATA_ERRORS = (DataError, IntegrityError, ValueError, TypeError)


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
        # compiled once (SQLAlchemy compiles an ON CONFLICT insert anew on every execution)
        self._insert_report = Precompiled(
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
                "worst_severity": str(worst_severity(r.findings)),
                "metrics": r.metrics or None,
            }
            for rid, r in unique
        ]
        # executemany of one compiled statement (SQLAlchemy batches it into multi-row INSERTs
        # with RETURNING itself); a .values(rows) statement would be compiled anew per batch
        new_ids = {row[0] for row in self._insert_report.execute(conn, rows)}
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
        fold_reports(
            conn,
            sorted(new_reports, key=lambda t: t[1].sent_at),
            received,
            self.max_open_findings,
        )
        first_time: set[str] = set()
        out = []
        for rid in ids:
            is_new = rid in new_ids and rid not in first_time
            first_time.add(rid)
            out.append(is_new)
        return out


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
