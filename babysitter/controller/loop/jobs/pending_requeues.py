"""The pending requeue actions by job, for `JobTracker.record_requeue` (one pending requeue per
job). Inside `kept()` they are read once and kept current by the tracker's own writes: a rack's
drains queue one requeue per babysat job, and each insert made the next job's lookup read the
pending actions again (the tick's statements grew with the number of jobs). Outside it every
lookup reads the store (which remembers the read until the actions table is written)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.store import Store

READ_LIMIT = 5000  # the newest pending actions looked through (as before: one listing)


class PendingRequeues:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._open = False
        self._known: dict[int, Action] | None = None

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
            found: dict[int, Action] = {}
            for a in self.store.actions(status=ActionStatus.PENDING, limit=READ_LIMIT):
                if a.kind is ActionKind.REQUEUE and a.job_id is not None:
                    found.setdefault(a.job_id, a)  # newest first
            if not self._open:
                return found.get(job_id)
            self._known = found
        return self._known.get(job_id)

    def wrote(self, a: Action) -> None:
        """The tracker has just recorded or changed this pending requeue, as given."""
        if self._known is not None and a.job_id is not None:
            self._known[a.job_id] = a
