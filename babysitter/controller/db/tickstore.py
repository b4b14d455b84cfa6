"""The policy tick's reads and batched writes, sized for 10,000 nodes.

Reads: only the rows and columns a tick needs (the policy's node rows: db/policy_read.py).

Writes: a rack of 32 nodes drained in one tick is one transaction for the 32 actions and one
for their outcomes, not ~130 (SQLite has one writer: each transaction of the tick queued
behind an ingest batch, and the tick took seconds under load).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import (
    Connection,
    String,
    and_,
    bindparam,
    case,
    cast,
    func,
    select,
    true,
    update,
)

from babysitter.controller.db import models as m
from babysitter.controller.db import store as clock
from babysitter.controller.db.action_view import done_drains_patch, pending_drains_patch
from babysitter.controller.db.actions import Action, ActionStatus
from babysitter.controller.db.episodes import episode_start
from babysitter.controller.db.policy_read import NAMED, OPEN_FINDINGS
from babysitter.controller.db.store import Store, aware, stored_finding
from babysitter.controller.db.upsert import dialect_insert
from babysitter.finding import Finding

_FINDINGS_NAMED = select(m.nodes.c.name, m.nodes.c.open_findings).where(NAMED)


def open_findings(store: Store, names: Collection[str]) -> dict[str, list[Finding]]:
    """Each named node's open findings (a node not in the table: left out), read once per
    tick and only for the nodes no earlier read of the tick has read."""

    def read(keys: list[tuple[str, str]]) -> dict[tuple[str, str], list[Finding]]:
        with store.reading() as c:
            got = c.execute(_FINDINGS_NAMED, {"names": sorted(k[1] for k in keys)})
            return {("open_findings", n): [stored_finding(f) for f in fs or []] for n, fs in got}

    keys = [("open_findings", n) for n in sorted(set(names))]
    return {k[1]: list(v) for k, v in store.reads.read_many(OPEN_FINDINGS, keys, read).items()}


_METRICS_TEXT = cast(m.nodes.c.metrics, String)
_METRICS_LIKE = select(m.nodes.c.name, _METRICS_TEXT).where(
    and_(m.nodes.c.metrics.is_not(None), _METRICS_TEXT.like(bindparam("pattern")))
)


def metrics_mentioning(store: Store, word: str) -> list[tuple[str, Any]]:
    """(node, metrics) of the nodes whose last report's metrics mention `word` (a key such
    as `perf` or `nvlink_domain`); the text filter runs in the database, JSON is decoded
    only for the rows that pass it, and a row that does not decode is left out."""
    out = []
    with store.reading() as c:
        for name, raw in c.execute(_METRICS_LIKE, {"pattern": f"%{word}%"}):
            try:
                out.append((name, json.loads(raw) if isinstance(raw, str) else raw))
            except ValueError:
                continue
    return out


def perf_metrics(store: Store) -> list[tuple[str, Any]]:
    """(node, metrics) of the nodes whose report metrics carry a throughput measurement
    (`perf_gflops`, `perf_busbw`)."""
    return metrics_mentioning(store, "perf")


# who decides the drains the rolling hour's budget counts: the node policy and switch incidents
AUTOMATIC_DRAINERS = ("policy", "fabric")


_A = m.actions.c
_DRAINS_SINCE = select(_A.id, _A.done_at).where(
    _A.kind == "drain",
    _A.status == str(ActionStatus.DONE),
    _A.requested_by.in_(AUTOMATIC_DRAINERS),
    _A.done_at >= bindparam("start"),
)


def drains_since(store: Store, since: datetime) -> int:
    """Automatic drains carried out since `since` (the drain budget's rolling hour), counted
    in the database: every one of them, however many other actions there are."""

    def read(start: datetime) -> list[tuple[int, datetime]]:
        with store.reading() as c:
            rows = c.execute(_DRAINS_SINCE, {"start": start})
            return [(int(i), t) for i, at in rows if (t := aware(at)) is not None]

    key = ("drains_since",)
    return len(store.reads.read_since(("actions",), key, since, read, _second, _DONE_AUTOMATIC))


def _done_at(a: Action) -> tuple[int, datetime] | None:
    return None if a.done_at is None else (a.id, a.done_at)


_DONE_AUTOMATIC = done_drains_patch(AUTOMATIC_DRAINERS, _done_at)


_PENDING_DRAINS = select(_A.id, _A.node, _A.dry_run).where(
    _A.kind == "drain", _A.status == str(ActionStatus.PENDING), _A.node.is_not(None)
)


def pending_drain_nodes(
    store: Store, before_action: int | None = None, *, dry_run: bool | None = False
) -> set[str]:
    """The nodes of every pending drain (of those recorded before `before_action` when given),
    counted in the database for the caps: `Store.pending_actions` lists only the newest 1,000
    pending actions, so in a long slurmctld outage on a big fleet the drains queued first
    (behind thousands of requeues) went uncounted and a cap could be exceeded. `dry_run`:
    False (default) real drains only, True dry-run ones only, None both."""

    def read() -> dict[int, tuple[str, bool]]:  # run only when not remembered
        with store.reading() as c:
            return {int(i): (str(n), bool(d)) for i, n, d in c.execute(_PENDING_DRAINS)}

    # one read a tick for every kind of drain the steps ask about (facts, each cap's count
    # ahead of its action), kept current through the tick's own writes of actions
    rows = store.reads.read(("actions",), ("pending_drains",), read, _PENDING_DRAINS_PATCH)
    before = before_action
    return {
        n
        for i, (n, d) in rows.items()
        if (before is None or i < before) and (dry_run is None or d == dry_run)
    }


_PENDING_DRAINS_PATCH = pending_drains_patch()


_drain_when = func.coalesce(_A.done_at, _A.created_at)
_DRAIN_TIMES = select(_A.id, _A.node, _drain_when).where(
    _A.kind == "drain",
    _A.status == str(ActionStatus.DONE),
    _A.requested_by == "policy",
    _A.node.is_not(None),
    _drain_when >= bindparam("start"),
)


def policy_drain_times(store: Store, since: datetime) -> dict[str, list[datetime]]:
    """Per node, when each drain the policy decided and Slurm carried out since `since` was done
    (the lemon count, `Action.is_policy_drain_done`), counted in the database: a listing of the
    newest actions would miss drains behind thousands of other actions."""

    def read(start: datetime) -> list[tuple[int, str, datetime]]:
        with store.reading() as c:
            rows = c.execute(_DRAIN_TIMES, {"start": start})
            return [(int(i), str(n), t) for i, n, at in rows if (t := aware(at)) is not None]

    out: dict[str, list[datetime]] = {}
    key = ("drain_times",)
    for _, node, t in store.reads.read_since(("actions",), key, since, read, _last, _DONE_POLICY):
        out.setdefault(node, []).append(t)
    for times in out.values():  # oldest first, however the rows came (a patch appends a row
        times.sort()  # settled again after newer ones; the database has no order without one)
    return out


def _second(row: tuple[int, datetime]) -> datetime:
    return row[1]


def _last(row: tuple[int, str, datetime]) -> datetime:
    return row[2]


def _drain_time(a: Action) -> tuple[int, str, datetime] | None:
    when = a.done_at or a.created_at
    return None if a.node is None or when is None else (a.id, a.node, when)


_DONE_POLICY = done_drains_patch(("policy",), _drain_time)


def record_actions(
    store: Store, actions: list[Action], at: datetime, done: Collection[Action] = ()
) -> list[Action]:
    """Insert pending actions, and `done` (records of what the tick did, as they are, e.g. a
    breaker tripping), in one statement; returns them recorded (with their ids), in order:
    the pending ones, then `done`."""
    if not actions and not done:
        return []
    records = [a.created(clock.now()) for a in done]  # Store.record's clock
    with store.reads.writing("actions") as w, store.engine.begin() as c:
        return [w.add(a) for a in _insert(store, c, _pending(actions, at) + records)]


def record_rows(store: Store, actions: list[Action]) -> list[Action]:
    """Insert actions as they are (created now; done now unless pending) in one statement;
    returns them recorded (with their ids), in order."""
    if not actions:
        return []
    at = clock.now()  # Store.record's clock (a simulation sets it)
    with store.reads.writing("actions") as w, store.engine.begin() as c:
        return [w.add(a) for a in _insert(store, c, [a.created(at) for a in actions])]


def _pending(actions: list[Action], at: datetime) -> list[Action]:
    """The rows of new pending actions recorded at `at`."""
    return [replace(a, status=ActionStatus.PENDING).created(at) for a in actions]


def _insert(store: Store, c: Connection, rows: list[Action]) -> list[Action]:
    # one statement for a rack's drains (insertmanyvalues). PostgreSQL returns the ids in the
    # rows' order when asked; SQLite cannot be asked (SQLAlchemy would insert row by row), but
    # a statement's new rowids ascend in the order its rows are inserted: sorted, they match
    sqlite = store.engine.dialect.name == "sqlite"
    q = m.actions.insert().returning(m.actions.c.id, sort_by_parameter_order=not sqlite)
    ids = c.execute(q, [a.columns() for a in rows]).scalars().all()
    if sqlite:
        ids = sorted(ids)
    return [a.recorded(int(i)) for a, i in zip(rows, ids, strict=True)]


def _outcomes_and_inserts(
    store: Store, c: Connection, settled: list[Action], new: list[Action]
) -> list[Action]:
    """The rows `settled` as their outcomes leave them, and the `new` rows, in one statement
    (a settle's outcomes and the follow-ups they lead to): an upsert on the id, where a row
    there is takes only its outcome columns. Returns `settled` then `new`, recorded. The new
    rows' ids are the ones the rows there are do not have, ascending in the rows' order."""
    if not settled:
        return _insert(store, c, new)
    # an action settled twice keeps its last outcome, as updates one after the other would
    # (an upsert may not touch a row twice)
    settled = list({a.id: a for a in settled}.values())
    got = c.execute(
        _upsert(store.engine.dialect.name),
        [{**a.columns(), "id": a.id} for a in settled] + [{**a.columns(), "id": None} for a in new],
    ).scalars()
    there = {a.id for a in settled}
    ids = sorted(i for i in map(int, got) if i not in there)
    return settled + [a.recorded(i) for a, i in zip(new, ids, strict=True)]


_OUTCOME = ("status", "outcome", "done_at", "attempts")  # what a settle changes in a row


def _upsert(dialect: str) -> Any:
    # a new row's id (None) is the table's own: SQLite gives a NULL rowid the next one, and
    # PostgreSQL's is drawn from its sequence in the statement (one round trip, row by row
    # in the rows' order)
    given = bindparam("id", type_=m.actions.c.id.type)
    if dialect == "sqlite":
        q = dialect_insert(dialect)(m.actions).values(id=given)
    else:
        next_id = func.nextval(func.pg_get_serial_sequence("actions", "id"))
        q = dialect_insert(dialect)(m.actions).values(id=func.coalesce(given, next_id))
    q = q.on_conflict_do_update(
        index_elements=[m.actions.c.id], set_={k: q.excluded[k] for k in _OUTCOME}
    )
    return q.returning(m.actions.c.id)


@dataclass(frozen=True)
class Drained:
    node: str
    reason: str
    ours: bool = True  # babysitter's to resume (an admin's manual drain is not)


@dataclass(frozen=True)
class Outcome:
    """What became of an action."""

    action_id: int
    status: ActionStatus
    outcome: str
    attempts: int = 1

    def row(self, before: Action, at: datetime) -> Action:
        """The action's row, as it was `before`, as the outcome leaves it (settle's update)."""
        return replace(
            before,
            status=self.status,
            outcome=self.outcome[:1000],
            done_at=at,
            attempts=self.attempts,
        )


@dataclass
class Settled:
    """Outcomes of a batch of drains/resumes, written in one transaction."""

    drained: list[Drained] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    actions: list[Outcome] = field(default_factory=list)
    follow_ups: list[Action] = field(default_factory=list)  # new pending actions
    # node -> the columns the tick's outcome writes for it (its verdict, its Slurm state),
    # written with its move: a node drained or resumed in a tick has its row written once
    node_columns: dict[str, dict[str, Any]] = field(default_factory=dict)


class NodeColumns(Protocol):
    """What a move's write of its node's row also carries (record/outcome.py: the tick's
    verdict columns), told when it has been written."""

    def columns(self, names: list[str]) -> dict[str, dict[str, Any]]: ...

    def written(self, columns: dict[str, dict[str, Any]]) -> None: ...


_n = m.nodes
# what a move sets in its node's row (its verdict columns are added by Settled.node_columns)
_MOVED: dict[str, dict[str, Any]] = {
    "drain": {
        "babysitter_drained": bindparam("b_ours"),
        "drain_reason": bindparam("b_reason"),
        "drained_at": bindparam("b_at"),
        # babysitter's drains (a held one carried out included) start a new validation
        # history; an admin's starts none
        "drain_episode": case(
            (bindparam("b_ours") == true(), episode_start()), else_=_n.c.drain_episode
        ),
    },
    "resume": {"babysitter_drained": False, "drain_reason": None, "consecutive_clean": 0},
}


def _moves(c: Connection, s: Settled, at: datetime) -> None:
    """The moved nodes' rows: one statement per kind of move and set of columns (a rack
    drained together: one)."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    rows = [
        ("drain", d.node, {"b_reason": d.reason, "b_ours": d.ours, "b_at": at}) for d in s.drained
    ]
    rows += [("resume", node, {}) for node in s.resumed]
    for kind, node, params in rows:
        extra = s.node_columns.get(node, {})
        groups.setdefault((kind, *sorted(extra)), []).append(
            {"b_name": node, **params, **{f"v_{k}": v for k, v in extra.items()}}
        )
    for (kind, *columns), params_list in groups.items():
        values = {**_MOVED[kind], **{k: bindparam(f"v_{k}") for k in columns}}
        c.execute(update(_n).where(_n.c.name == bindparam("b_name")).values(values), params_list)


def settle(store: Store, s: Settled, at: datetime) -> None:
    if not (s.drained or s.resumed or s.follow_ups or s.actions):
        return  # a steady tick: no transaction to open
    a = m.actions
    # each settled action's row as the tick knows it now, looked up before the write (the
    # executor's copy may predate one of the tick's writes)
    known = [store.reads.known("actions", o.action_id) for o in s.actions]
    with store.reads.writing("actions") as w, store.engine.begin() as c:
        _moves(c, s, at)
        # the outcomes of the actions the tick knows, with the follow-ups: one statement
        rows = [
            o.row(before, at)
            for o, before in zip(s.actions, known, strict=True)
            if before is not None
        ]
        if s.follow_ups or rows:
            for row in _outcomes_and_inserts(store, c, rows, _pending(s.follow_ups, at)):
                w.add(row)
        unknown = [o for o, before in zip(s.actions, known, strict=True) if before is None]
        if unknown:
            c.execute(
                update(a)
                .where(a.c.id == bindparam("b_id"))
                .values(
                    status=bindparam("b_status"),
                    outcome=bindparam("b_outcome"),
                    done_at=at,
                    attempts=bindparam("b_attempts"),
                ),
                [
                    {
                        "b_id": o.action_id,
                        "b_status": str(o.status),
                        "b_outcome": o.outcome[:1000],
                        "b_attempts": o.attempts,
                    }
                    for o in unknown
                ],
            )
            w.add(None)  # rows the tick did not know: its reads of actions are stale
