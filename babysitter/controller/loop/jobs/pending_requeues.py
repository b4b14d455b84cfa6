"""The pending requeue actions by job, for `JobTracker.record_requeue` (one pending requeue per
job). Inside `kept()` they are read once and kept current by the tracker's own writes: a rack's
drains queue one requeue per babysat job, and each insert made the next job's lookup read the
pending actions again (the tick's statements grew with the number of jobs). Outside it every
lookup reads the store (which remembers the read until the actions table is written)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.store import PENDING_LISTING, Store

READ_LIMIT = PENDING_LISTING  # the tick's listing of pending actions: one read for both


class PendingRequeues:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._open = False
        self._known: dict[int, list[Action]] | None = None  # job -> its pending, newest first

    @contextmanager
    def kept(self) -> Iterator[None]:
        """One run of requeue recording (the tick's pending actions): one read. A requeue
        another writer (the API) records meanwhile is seen from the next run on."""
        self._open, self._known = True, None
        try:
            yield
        finally:
            self._open, self._known = False, None

    def of(self, job_id: int) -> Action | None:
        """The job's pending requeue (the newest, if there were more)."""
        if self._known is None:
            found: dict[int, list[Action]] = {}
            for a in self.store.actions(status=ActionStatus.PENDING, limit=READ_LIMIT):
                if a.kind is ActionKind.REQUEUE and a.job_id is not None:
                    found.setdefault(a.job_id, []).append(a)  # newest first
            if not self._open:
                return next(iter(found.get(job_id, [])), None)
            self._known = found
        return next(iter(self._known.get(job_id, [])), None)

    def wrote(self, a: Action) -> None:
        """The tracker has just recorded or changed this pending requeue, as given."""
        if self._known is not None and a.job_id is not None:
            rest = [k for k in self._known.get(a.job_id, []) if k.id != a.id]
            self._known[a.job_id] = sorted([a, *rest], key=lambda k: -k.id)

    def settled(self, a: Action) -> None:
        """The run has carried this action out (done, failed, skipped): a requeue of it is
        no longer pending (the job's next fault queues a new one, as a fresh read would)."""
        if self._known is not None and a.kind is ActionKind.REQUEUE and a.job_id is not None:
            self._known[a.job_id] = [k for k in self._known.get(a.job_id, []) if k.id != a.id]
