"""Retention: keeps the store from growing without bound, in its own thread so the policy
loop never waits for it.

At 10,000 nodes every 5 s the store takes ~170 M reports a day. What is kept (decided here,
documented in README "Sizing the controller"):
- clean reports (worst severity ok/info) for `controller.clean_report_minutes` (default 10):
  the node row keeps the latest state and its consecutive-clean count, which is all the policy
  reads from them; a clean report is no evidence anyone looks up later. No summary rows: a
  per-node count of clean reports tells nothing the node row and the reports with findings do
  not;
- reports with findings (warning/critical), and their findings, for `retention_days`.
Deletes go oldest first in transactions of `retention_batch` reports, with a pause between
them so the ingest writer (SQLite has one writer) waits at most one small batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select

from babysitter.config import ControllerConfig
from babysitter.controller import models as m
from babysitter.controller.store import Store
from babysitter.finding import Severity

log = logging.getLogger(__name__)
CLEAN = tuple(s for s in Severity if s <= Severity.INFO)  # thinned first
PAUSE_S = 0.05  # between batches: the ingest writer gets the database in between


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
        c.execute(delete(m.findings).where(m.findings.c.report_id.in_([x[1] for x in rows])))
        c.execute(delete(r).where(r.c.id.in_([x[0] for x in rows])))
    return len(rows)


class Retention:
    def __init__(
        self,
        store: Store,
        cfg: ControllerConfig,
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.active = active  # only the leader prunes (two would only race for the same rows)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.deleted = 0
        self.batches = 0

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
                n = prune_batch(self.store, cutoff, self.cfg.retention_batch, severity)
                self.batches += n > 0
                total += n
                if n < self.cfg.retention_batch:
                    break
                self._stop.wait(PAUSE_S)
        self.deleted += total
        return total

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
