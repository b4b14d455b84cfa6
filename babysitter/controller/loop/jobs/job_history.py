"""A babysat job's row in the store as the tracker writes it: its history (what babysitter did
or hit, capped), its errors (once per distinct error) and what the scan last wrote of it, so an
unchanged job is not rewritten every scan."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import cast

from babysitter.controller.db.job_rows import job_rows, upsert_jobs
from babysitter.controller.db.store import HistoryEntry, JobRow, Store

log = logging.getLogger(__name__)
HISTORY_MAX = 50  # entries kept per job (a job failing every tick must not grow a row forever)


class JobHistory:
    def __init__(self, store: Store) -> None:
        self.store = store
        # job -> what the scan last wrote of it: an unchanged job is not rewritten every scan
        # (thousands of babysat jobs, one transaction each, every job_scan_s)
        self._scanned: dict[int, dict[str, object]] = {}
        # inside `kept`: the rows saved, written when it ends (job -> its values)
        self._held: dict[int, dict[str, object]] | None = None
        self._rows: dict[int, JobRow] = {}  # the run's jobs as read (`kept`)
        self._read: set[int] = set()  # whose row was read (a job without one has none)

    @contextmanager
    def kept(self, job_ids: list[int]) -> Iterator[None]:
        """A run over these jobs (the tick's due requeues): their rows read in one statement
        and kept here (a requeue runs on a worker thread, where the tick remembers nothing),
        what the run saves held until the caller's `flush` (a rack's requeues: one read and
        one write, not one of each per job; the caller writes them with the run's outcomes)."""
        self._rows = job_rows(self.store, job_ids) if job_ids else {}
        self._read = set(job_ids)
        self._held = {}
        try:
            yield
        finally:
            self._held, self._rows, self._read = None, {}, set()

    def flush(self) -> None:
        """Write what the run has saved so far, in one transaction (a failure loses them: the
        run's actions stay pending and are carried out again)."""
        held, self._held = self._held, ({} if self._held is not None else None)
        if held:
            upsert_jobs(self.store, list(held.items()))
            for job_id, values in held.items():
                self._rows[job_id] = _merged(self._rows.get(job_id), values)

    def row(self, job_id: int) -> JobRow | None:
        if job_id in self._read:
            row = self._rows.get(job_id)
        else:
            row = next(iter(self.store.jobs(job_id)), None)
        held = (self._held or {}).get(job_id)
        return row if held is None else _merged(row, held)

    def entries(self, job_id: int) -> list[HistoryEntry]:
        row = self.row(job_id)
        return list((row or {}).get("history") or [])

    def append(self, job_id: int, entry: HistoryEntry, **values: object) -> None:
        history = self.entries(job_id)
        history.append(entry)
        self.save(job_id, history, **values)

    def save(self, job_id: int, history: list[HistoryEntry], **values: object) -> None:
        """Write the job's row with its (capped) history."""
        self._scanned.pop(job_id, None)  # the row moved: the next scan writes it again
        if self._held is not None:
            self._held[job_id] = {**self._held.get(job_id, {}), **values}
            self._held[job_id]["history"] = history[-HISTORY_MAX:]
            return
        self.store.upsert_job(job_id, history=history[-HISTORY_MAX:], **values)

    def record_error(self, job_id: int, what: str, exc: BaseException, now: datetime) -> None:
        """A job whose handling failed: the error goes into its history (shown by
        /api/v1/jobs and `babysitter jobs`), once per distinct error."""
        err = f"{what}: {type(exc).__name__}: {str(exc)[:300]}"
        try:
            history = self.entries(job_id)
            last = history[-1] if history else None
            if last and last.get("event") == "error" and last.get("error") == err:
                return  # recorded (and logged) once
            log.warning("job %s: %s", job_id, err)
            self.append(job_id, {"event": "error", "at": now.isoformat(), "error": err})
        except Exception:
            log.exception("cannot record the error of job %s", job_id)

    def write_scan(self, job_id: int, values: dict[str, object]) -> None:
        if self._scanned.get(job_id) == values:
            return
        self.store.upsert_job(job_id, **values)
        self._scanned[job_id] = values

    def forget_all_but(self, live: set[int]) -> None:
        """Forget jobs that left the queue: a long-running controller sees millions of ids."""
        for gone in self._scanned.keys() - live:
            del self._scanned[gone]


def _merged(row: JobRow | None, values: dict[str, object]) -> JobRow:
    """The job's row as it reads once `values` are written."""
    return cast(JobRow, {**(row or {}), **values})
