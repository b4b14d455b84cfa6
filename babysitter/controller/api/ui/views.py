"""What each status page shows, gathered from the store (read only): the fleet grouped by
partition (and leaf switch where Slurm has a topology), a node's findings, timeline and
actions with their evidence, the babysat jobs, the audit log, the guard and the maintenance
windows. Verdicts are the API's own (node_view)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from babysitter.controller.api.api_read import node_view
from babysitter.controller.db import audit
from babysitter.controller.db.actions import Action, ActionKind
from babysitter.controller.db.store import JobRow, Store, now
from babysitter.controller.loop import maintenance
from babysitter.controller.loop.guard import guard_view

VERDICTS = ("unhealthy", "suspect", "unknown", "validating", "healthy")
NO_PARTITION = "(no Slurm partition known)"
LEMON_CONDITIONS = ("lemon_node", "validation_lemon")
# node name -> the groups it is shown in: its Slurm partitions, split by leaf switch where
# there is a topology (the leader's snapshot; empty on a replica)
Layout = Callable[[], Mapping[str, tuple[str, ...]]]


@dataclass(frozen=True)
class Tile:
    name: str
    verdict: str
    drained: bool
    maintenance: bool
    problem: str
    slurm_state: str
    heartbeat_age_s: float | None


@dataclass(frozen=True)
class Group:
    name: str
    tiles: list[Tile]
    counts: dict[str, int]


@dataclass(frozen=True)
class Fleet:
    groups: list[Group]
    counts: dict[str, int]
    total: int
    guard: dict[str, Any]
    windows: list[maintenance.Window]
    jobs: list[JobRow]
    recent: list[audit.AuditEntry]
    alerts: list[dict[str, Any]]
    at: datetime


@dataclass(frozen=True)
class TimelineItem:
    at: datetime
    kind: str  # finding | action
    title: str
    detail: str
    css: str  # severity or result: colours the entry


@dataclass(frozen=True)
class NodePage:
    node: dict[str, Any]
    window: maintenance.Window | None
    timeline: list[TimelineItem]
    actions: list[audit.AuditEntry]
    jobs: list[JobRow]
    alerts: list[dict[str, Any]]
    drains_7d: int
    lemon: bool
    validations: list[Action]
    at: datetime = field(default_factory=now)


def _tile(view: dict[str, Any], in_maintenance: bool) -> Tile:
    findings = view["open_findings"]
    return Tile(
        name=view["name"],
        verdict=view["verdict"],
        drained=view["babysitter_drained"],
        maintenance=in_maintenance,
        problem=findings[0]["message"] if findings else "",
        slurm_state=view.get("slurm_state") or "",
        heartbeat_age_s=view["heartbeat_age_s"],
    )


def _counts(tiles: list[Tile]) -> dict[str, int]:
    out = {v: 0 for v in VERDICTS}
    for t in tiles:
        out[t.verdict] = out.get(t.verdict, 0) + 1
    return out


def _firing(store: Store) -> list[dict[str, Any]]:
    """Firing alerts, the most severe first."""
    firing = sorted((a for a in store.alerts() if a["state"] == "firing"), key=lambda a: a["key"])
    return sorted(firing, key=lambda a: a["severity"], reverse=True)


def fleet(store: Store, runtime_state: dict[str, Any], layout: Layout) -> Fleet:
    quiet = maintenance.nodes_in_maintenance(store)
    tiles = [_tile(node_view(n, runtime_state), n["name"] in quiet) for n in store.node_rows()]
    parts = layout()
    by_group: dict[str, list[Tile]] = {}
    for t in tiles:
        for p in parts.get(t.name) or (NO_PARTITION,):
            by_group.setdefault(p, []).append(t)
    # worst first inside a group: on-call looks at the red ones
    rank = {v: i for i, v in enumerate(VERDICTS)}
    groups = [
        Group(name, sorted(ts, key=lambda t: (rank.get(t.verdict, 0), t.name)), _counts(ts))
        for name, ts in sorted(by_group.items())
    ]
    return Fleet(
        groups=groups,
        counts=_counts(tiles),
        total=len(tiles),
        guard=guard_view(store),
        windows=maintenance.windows(store),
        jobs=store.jobs(),
        recent=audit.entries(store, limit=15),
        alerts=_firing(store),
        at=now(),
    )


def _finding_item(f: dict[str, Any]) -> TimelineItem:
    return TimelineItem(
        at=f["observed_at"],
        kind="finding",
        title=f"{f['severity']} {f['code']} ({f['check']}, {f['component']})",
        detail=f["message"],
        css=str(f["severity"]),
    )


def _action_item(e: audit.AuditEntry) -> TimelineItem:
    return TimelineItem(
        at=e.at,
        kind="action",
        title=f"{e.kind} {e.result} by {e.actor}",
        detail="; ".join(x for x in (e.reason, e.outcome) if x),
        css=f"result-{e.result}",
    )


def node_page(store: Store, runtime_state: dict[str, Any], name: str) -> NodePage | None:
    row = store.node(name)
    if row is None:
        return None
    actions = audit.entries(store, node=name, limit=200)
    history = store.findings(node=name, limit=200)
    timeline = sorted(
        [*map(_finding_item, history), *map(_action_item, actions)],
        key=lambda i: i.at,
        reverse=True,
    )
    week = now() - timedelta(days=7)
    alerts = [a for a in _firing(store) if a["node"] == name]
    return NodePage(
        node=node_view(row, runtime_state),
        window=maintenance.nodes_in_maintenance(store).get(name),
        timeline=timeline[:200],
        actions=actions,
        jobs=[j for j in store.jobs() if name in (j.get("nodes") or [])],
        alerts=alerts,
        drains_7d=sum(
            1
            for e in actions
            if e.kind == "drain" and e.result is audit.AuditResult.DONE and e.at >= week
        ),
        lemon=any(a["condition"] in LEMON_CONDITIONS for a in alerts),
        validations=[
            a for a in store.actions(limit=2000) if a.node == name and a.kind is ActionKind.VALIDATE
        ][:20],
    )
