"""The tick's remembered reads of the actions table, kept current through its own writes
(issue 52: a step's writes update the view the next step reads). Each read of actions says
how one of its answers changes when rows are written (`TickReads.writing`): a row inserted or
updated, as it now is in the table, is placed where the read's own WHERE and ORDER BY would
place it. Where that cannot be told from the rows known (a listing cut at its limit that
loses a row), the patch answers None and the read is made again."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.row_patches import newest_first

Recorded = Action
RowPatch = Callable[[list[Any], list[Recorded]], list[Any] | None]


def listing_patch(
    status: str | None, limit: int
) -> Callable[[list[Recorded], list[Recorded]], list[Recorded] | None]:
    """For the newest `limit` actions (of `status` when given), newest first."""
    return newest_first(limit, lambda a: status is None or a.status == status)


def pending_drains_patch() -> Callable[
    [dict[int, tuple[str, bool]], list[Recorded]], dict[int, tuple[str, bool]]
]:
    """For every pending drain of a node: id -> (node, dry_run)."""

    def patch(value: dict[int, tuple[str, bool]], rows: list[Recorded]) -> dict[int, Any]:
        out = dict(value)
        for r in rows:
            out.pop(r.id, None)
            pending_drain = r.kind is ActionKind.DRAIN and r.status is ActionStatus.PENDING
            if pending_drain and r.node is not None:
                out[r.id] = (r.node, r.dry_run)
        return out

    return patch


def done_drains_patch(
    requested_by: Collection[str], row: Callable[[Recorded], tuple[Any, ...] | None]
) -> RowPatch:
    """For rows `(id, ...)` of the drains carried out that `requested_by` decided: `row` makes
    an action's row (None: it has none, as the read's WHERE says)."""

    def patch(value: list[Any], rows: list[Recorded]) -> list[Any]:
        ids = {r.id for r in rows}
        out = [v for v in value if v[0] not in ids]
        for r in rows:
            done = r.kind is ActionKind.DRAIN and r.status is ActionStatus.DONE
            if done and r.requested_by in requested_by and (new := row(r)) is not None:
                out.append(new)
        return out

    return patch


# update_action's columns that are an Action's fields as they are (status is read as its
# enum); an update of another column reads the table again
_FIELDS = {"outcome", "attempts", "done_at", "next_attempt_at"}


def after_update(known: Recorded | None, values: dict[str, Any]) -> Recorded | None:
    """The row `known` as an update of `values` leaves it; None when it cannot be told (the
    row was not known, or a value is one the table would store otherwise)."""
    if known is None:
        return None
    fields: dict[str, Any] = {}
    for k, v in values.items():
        if k == "status":
            try:
                fields[k] = ActionStatus(str(v))
            except ValueError:
                return None
        elif k in _FIELDS and (k in ("outcome", "attempts") or _aware(v)):
            fields[k] = v
        else:
            return None
    return replace(known, **fields)


def _aware(v: Any) -> bool:
    """A time the table gives back as it was given (a naive one would come back as UTC)."""
    return v is None or getattr(v, "tzinfo", None) is not None
