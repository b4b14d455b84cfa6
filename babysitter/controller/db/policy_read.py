"""The policy's read of a tick: the node rows that may need a decision and every node's XIDs of
the escalation window, in one statement (a UNION ALL of the two shapes; they were two reads a
tick, both of tables the ingest writes, so neither could be remembered between ticks).

A healthy node (no open finding, reporting in time, not drained, verdict already `healthy`)
gives the policy nothing to decide, so a steady tick reads only the nodes that may: with open
findings, a verdict other than healthy, drained by babysitter, silent past the heartbeat
timeout, with an XID in the window, or named by the engine (Slurm state changed, alerts firing,
drain/validation history). Reading and decoding every node row each tick was 0.45 s of CPU at
10,000 nodes (held the GIL and starved ingest); this is a filtered scan in SQLite's C code."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    and_,
    bindparam,
    false,
    literal_column,
    null,
    or_,
    select,
    true,
    type_coerce,
    union_all,
)

from babysitter.controller.db import models as m
from babysitter.controller.db.audit import EVIDENCE_KEY, kept
from babysitter.controller.db.store import Store, aware, stored_finding

# larger name sets than this are read as a full pass (a long IN list costs more than a scan)
MAX_NAMED = 500

_N, _F = m.nodes.c, m.findings.c
_COLUMNS = (
    _N.name,
    _N.open_findings,
    _N.consecutive_clean,
    _N.last_report_at,
    _N.babysitter_drained,
    _N.slurm_reason,
)
_POLICY_COLUMNS = select(*_COLUMNS).order_by(_N.name)
_STEADY_CONDS = (
    _N.worst_severity != "ok",
    _N.verdict != "healthy",
    _N.babysitter_drained == true(),
    _N.last_report_at.is_(None),
    _N.last_report_at < bindparam("stale"),
)
# the shapes with names: an expanding IN, so each is built (and its cache key worked out) once
NAMED = _N.name.in_(bindparam("names", expanding=True))
_POLICY_NAMED = _POLICY_COLUMNS.where(NAMED)

# the escalation window's XIDs: critical `xid.<n>` findings observed since `since`
_XID = and_(_F.severity == "critical", _F.observed_at >= bindparam("since"), _F.code.like("xid.%"))
_HAS_XID = _N.name.in_(select(_F.node).where(_XID))


def _with_xids(where: ColumnElement[bool]) -> CompoundSelect:
    """The node rows `where` selects (or with an XID in the window) and the window's XIDs:
    `part` says which a row is; the XID columns are typed so both dialects decode them."""
    rows = select(
        literal_column("'n'").label("part"),
        *_COLUMNS,
        type_coerce(null(), _F.component.type).label("component"),
        type_coerce(null(), _F.code.type).label("code"),
        type_coerce(null(), _F.observed_at.type).label("observed_at"),
    ).where(or_(where, _HAS_XID))
    # one row an event: the agent sends a sticky XID again in every report until the reboot
    events = select(_F.node, _F.component, _F.code, _F.observed_at).where(_XID).distinct()
    x = events.subquery()
    xids = select(
        literal_column("'x'"),
        x.c.node,
        *(null() for _ in _COLUMNS[1:]),
        x.c.component,
        x.c.code,
        x.c.observed_at,
    )
    return union_all(rows, xids)


_FULL = _with_xids(true())
_STEADY = _with_xids(or_(*_STEADY_CONDS))
_STEADY_NAMED = _with_xids(or_(*_STEADY_CONDS, NAMED))
_ONLY_NAMED = _with_xids(NAMED)
_NONE = _with_xids(false())


@dataclass
class PolicyView:
    """What the policy reads of the store in a tick: node rows by name, XIDs by node."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    xids: dict[str, list[tuple[str, int, datetime]]] = field(default_factory=dict)


def policy_view(
    store: Store,
    since: datetime,
    *,
    full: bool = False,
    stale_before: datetime | None = None,
    names: Collection[str] = (),
) -> PolicyView:
    """Node rows (the columns the policy reads) of every node when `full`; else of the nodes
    that may need a decision (see the module doc: `stale_before` = now - heartbeat timeout,
    None for `names` only), and per node the critical XIDs observed since `since`:
    (component, xid, when). One statement."""
    params: dict[str, Any] = {"since": since}
    q = _FULL
    if full or len(names) > MAX_NAMED:
        pass
    elif stale_before is not None:
        params["stale"] = stale_before
        q = _STEADY  # every tick's shape: built once
        if names:
            q, params["names"] = _STEADY_NAMED, sorted(names)
    elif names:
        q, params["names"] = _ONLY_NAMED, sorted(names)
    else:
        q = _NONE
    view = PolicyView()
    stamp = store.reads.mark(OPEN_FINDINGS)
    with store.reading() as c:
        for r in c.execute(q, params):
            if r.part == "n":
                view.rows.append(dict(zip(_KEYS, r[1 : 1 + len(_KEYS)], strict=True)))
            elif (code := str(r.code))[4:].isascii() and code[4:].isdigit():
                at = aware(r.observed_at)
                assert at is not None
                view.xids.setdefault(r.name, []).append((r.component, int(code[4:12]), at))
    view.rows.sort(key=lambda r: str(r["name"]))
    _seed(store, stamp, view.rows)
    return view


_KEYS = tuple(c.name for c in _COLUMNS)


def policy_rows(store: Store, names: Collection[str]) -> list[dict[str, Any]]:
    """The policy's columns of the named nodes (the stragglers', the lemons')."""
    stamp = store.reads.mark(OPEN_FINDINGS)
    with store.reading() as c:
        rows = [r._asdict() for r in c.execute(_POLICY_NAMED, {"names": sorted(names)})]
    _seed(store, stamp, rows)
    return rows


OPEN_FINDINGS = ("nodes.open_findings",)  # what a read of the open findings depends on


def _seed(store: Store, stamp: Any, rows: list[dict[str, Any]]) -> None:
    """Decode the rows in place; the steps after the policy (an audit's evidence, the
    executor's requeue hold, the healer's starts) ask for the open findings read here."""
    store.reads.seed(stamp, {(EVIDENCE_KEY, r["name"]): kept(r["open_findings"]) for r in rows})
    for r in rows:
        r["last_report_at"] = aware(r["last_report_at"])
        r["open_findings"] = [stored_finding(f) for f in r["open_findings"] or []]
    store.reads.seed(stamp, {("open_findings", r["name"]): r["open_findings"] for r in rows})
