"""The shapes of the tick's remembered listings, and how each takes the rows the tick has just
written (`TickReads.writing`: each row as it now is in its table, known by `.id`). A listing
says which rows it keeps (its WHERE); the shape places them (its ORDER BY and LIMIT). The
actions table's listings (action_view.py) and the lemon ledger's (loop/read/ledger.py) share
them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")
Patch = Callable[[list[R], list[R]], list[R] | None]


def newest_first(limit: int, keeps: Callable[[Any], bool]) -> Patch[Any]:
    """For the newest `limit` rows that `keeps`, newest (highest id) first. A listing cut at
    its limit that loses a row cannot tell the next older one: None (read it again)."""

    def patch(value: list[Any], rows: list[Any]) -> list[Any] | None:
        full = len(value) >= limit
        oldest = value[-1].id if value else 0
        by_id = {r.id: r for r in value}
        for r in rows:
            by_id.pop(r.id, None)
        for r in rows:
            # with the listing cut, a row older than its oldest may have unknown rows after it
            if keeps(r) and not (full and r.id < oldest):
                by_id[r.id] = r
        out = sorted(by_id.values(), key=lambda r: -r.id)
        if full and len(out) < limit:
            return None  # the next older row is not known here
        return out[:limit]

    return patch


def every(keeps: Callable[[Any], bool]) -> Patch[Any]:
    """For every row that `keeps`, oldest (lowest id) first."""

    def patch(value: list[Any], rows: list[Any]) -> list[Any]:
        by_id = {r.id: r for r in value}
        for r in rows:
            if keeps(r):
                by_id[r.id] = r
            else:
                by_id.pop(r.id, None)
        return sorted(by_id.values(), key=lambda r: r.id)

    return patch
