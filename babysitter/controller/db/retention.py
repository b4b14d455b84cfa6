"""Retention: keeps the store from growing without bound, in its own thread so the policy
loop never waits for it.

At 10,000 nodes every 5 s the store takes ~170 M reports a day. What is kept (decided here,
documented in docs/architecture.md, "Scale"):
- clean reports (worst severity ok/info) for `controller.clean_report_minutes` (default 10):
  the node row keeps the latest state and its consecutive-clean count, which is all the policy
  reads from them; a clean report is no evidence anyone looks up later. No summary rows: a
  per-node count of clean reports tells nothing the node row and the reports with findings do
  not;
- reports with findings (warning/critical), and their findings, for `retention_days`.
Deletes go oldest first in transactions of at most `retention_batch` reports (fewer when a
transaction takes longer than BATCH_TARGET_S), with a pause between them so the ingest writer
(SQLite has one writer) waits at most one small batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select

from babysitter.config import ControllerConfig, RmaConfig
from babysitter.controller.db import audit
from babysitter.controller.db import models as m
from babysitter.controller.db.rma_retention import expire_archives
from babysitter.controller.db.store import Store
from babysitter.finding import Severity

log = logging.getLogger(__name__)
CLEAN = tuple(s for s in Severity if s <= Severity.INFO)  # thinned first
PAUSE_S = 0.05  # between batches: the ingest writer gets the database in between
# A delete transaction holds SQLite's one write lock, and every report arriving meanwhile waits
# for it (then for SQLite's busy-retry sleep): batches shrink until one takes about this long.
# 2,000 reports took ~55 ms beside 2,000 reports/s of ingest, a p99 spike every run.
BATCH_TARGET_S = 0.01
# ...but never below this: with the pauses, 200 per batch still deletes > 3,000 reports/s
MIN_BATCH = 200
RMA_BATCH = 100  # RMA archives expired per transaction round (a few a day at most)


def prune_batch(
    store: Store, cutoff: datetime, batch: int, severity: Severity | None = None
) -> int:
    """Delete up to `batch` of the oldest reports received before `cutoff` (only those whose
    worst severity is `severity`, when given) and their findings, in one transaction."""
    r = m.reports
    q = select(r.c.id, r.c.report_id).where(r.c.received_at < cutoff)
    if severity is not None:
        q = q.where(r.c.worst_severity == str(severity))
    q = q.order_by(r.c.received_at).limit(batch)
    with store.engine.begin() as c:
        rows = c.execute(q).all()
        if not rows:
            return 0
        if severity is not Severity.OK:  # an all-ok report has no finding rows (ingest.py)
            c.execute(delete(m.findings).where(m.findings.c.report_id.in_([x[1] for x in rows])))
        c.execute(delete(r).where(r.c.id.in_([x[0] for x in rows])))
    return len(rows)


def prune_resolved_alerts(store: Store, cutoff: datetime) -> int:
    """Alerts resolved before `cutoff`: a row per node|condition and per job key ever seen
    would otherwise grow for ever; the loop and the pages read only firing rows, and a
    condition that fires again starts a new row."""
    a = m.alerts
    with store.engine.begin() as c:
        n = c.execute(delete(a).where(a.c.state == "resolved", a.c.resolved_at < cutoff))
    return int(n.rowcount or 0)


class Retention:
    def __init__(
        self,
        store: Store,
        cfg: ControllerConfig,
        active: Callable[[], bool] = lambda: True,
        rma: RmaConfig | None = None,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.rma = rma  # None: RMA archives are not this process's to prune
        self.rma_expired = 0
        self.alerts_deleted = 0
        self.active = active  # only the leader prunes (two would only race for the same rows)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.deleted = 0
        self.audit_deleted = 0
        self.batches = 0
        self.batch = cfg.retention_batch  # adapted to BATCH_TARGET_S, at most the configured

    def run_once(self, now: datetime | None = None) -> int:
        """Prune until caught up (or stopped); returns the number of reports deleted."""
        now = now or datetime.now(UTC)
        plan: list[tuple[datetime, Severity | None]] = [
            (now - timedelta(days=self.cfg.retention_days), None)
        ]
        plan += [(now - timedelta(minutes=self.cfg.clean_report_minutes), s) for s in CLEAN]
        total = 0
        for cutoff, severity in plan:
            while not self._stop.is_set():
                size = self.batch
                started = time.monotonic()
                n = prune_batch(self.store, cutoff, size, severity)
                self._adapt(n, time.monotonic() - started)
                self.batches += n > 0
                total += n
                if n < size:
                    break
                self._stop.wait(PAUSE_S)
        self.deleted += total
        self.audit_deleted += self._prune_audit(now)
        self.alerts_deleted += prune_resolved_alerts(
            self.store, now - timedelta(days=self.cfg.retention_days)
        )
        if self.rma is not None:
            cutoff = now - timedelta(days=self.rma.keep_days)
            while not self._stop.is_set():
                n = expire_archives(self.store, self.rma.archive_dir, cutoff, RMA_BATCH)
                self.rma_expired += n
                if n < RMA_BATCH:
                    break
        return total

    def _prune_audit(self, now: datetime) -> int:
        """Audit entries past their (long) retention, in the same small batches."""
        cutoff = now - timedelta(days=self.cfg.audit_retention_days)
        total = 0
        while not self._stop.is_set():
            n = audit.prune(self.store, cutoff, self.batch)
            total += n
            if n < self.batch:
                break
            self._stop.wait(PAUSE_S)
        return total

    def _adapt(self, n: int, took: float) -> None:
        """Halve the batch after a transaction over the target, double it back (up to the
        configured size) after a full one well under it."""
        cap = self.cfg.retention_batch
        if took > BATCH_TARGET_S:
            self.batch = max(min(MIN_BATCH, cap), self.batch // 2)
        elif n >= self.batch and took < BATCH_TARGET_S / 2:
            self.batch = min(cap, self.batch * 2)

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.retention_interval_s):
            if not self.active():
                continue
            try:
                n = self.run_once()
                if n:
                    log.info("retention: pruned %d reports", n)
            except Exception:
                log.exception("retention failed (will retry)")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
