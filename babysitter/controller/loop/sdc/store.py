"""The SDC schedule's table (sdc_schedule): its rows loaded at a restart, saved as they
change (one executemany for a due cluster's thousands of rows), and shown by the API."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, select, update

from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store, aware
from babysitter.controller.loop.sdc.due import NodeSchedule


def load_rows(store: Store) -> dict[str, NodeSchedule]:
    """The schedule as it was saved, by node."""
    rows: dict[str, NodeSchedule] = {}
    with store.engine.connect() as c:
        for r in c.execute(select(m.sdc_schedule)):
            d = r._asdict()
            d.pop("updated_at", None)
            for k in ("ordered_at", "last_attempt_at", "last_run_at"):
                d[k] = aware(d[k])
            rows[d["node"]] = NodeSchedule(**d)
    return rows


def save_rows(store: Store, rows: Iterable[NodeSchedule], now: datetime | None) -> None:
    rows = list(rows)
    if not rows:
        return
    at = now or datetime.now(UTC)
    t = m.sdc_schedule
    with store.engine.begin() as c:
        have = set(
            c.execute(select(t.c.node).where(t.c.node.in_([r.node for r in rows]))).scalars()
        )
        new = [r.row(at) for r in rows if r.node not in have]
        old = [{f"b_{k}": v for k, v in r.row(at).items()} for r in rows if r.node in have]
        if new:
            c.execute(t.insert(), new)
        if old:  # one executemany: a due cluster changes thousands of rows at once
            c.execute(_UPDATE, old)


_UPDATE = (
    update(m.sdc_schedule)
    .where(m.sdc_schedule.c.node == bindparam("b_node"))
    .values({c.name: bindparam(f"b_{c.name}") for c in m.sdc_schedule.c if c.name != "node"})
)


def schedule_rows(store: Store) -> list[dict[str, Any]]:
    """The schedule as the API shows it, by node."""
    with store.engine.connect() as c:
        rows = [
            r._asdict() for r in c.execute(select(m.sdc_schedule).order_by(m.sdc_schedule.c.node))
        ]
    for r in rows:
        for k in ("ordered_at", "last_attempt_at", "last_run_at", "updated_at"):
            r[k] = aware(r[k])
        r["testing"] = r["hold"] is not None
    return rows
