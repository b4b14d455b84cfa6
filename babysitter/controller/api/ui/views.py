"""What a node's status page shows, gathered from the store (read only): its findings,
timeline and actions with their evidence, its jobs and alerts. Verdicts are the API's own
(node_view). The fleet page reads the published snapshot instead (controller/api/fleet_view.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from babysitter.controller.api.api_read import history_since, node_view
from babysitter.controller.db import audit
from babysitter.controller.db.actions import Action, ActionKind
from babysitter.controller.db.store import JobRow, Store, now
from babysitter.controller.loop.admit import maintenance
from babysitter.controller.loop.heal.rma import Archive, archives

LEMON_CONDITIONS = ("lemon_node", "validation_lemon")


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
    rma_archives: list[Archive] = field(default_factory=list)  # newest first


def _firing(store: Store) -> list[dict[str, Any]]:
    """Firing alerts, the most severe first."""
    firing = sorted(store.firing_alerts(), key=lambda a: a["key"])
    return sorted(firing, key=lambda a: a["severity"], reverse=True)


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
    week = now() - timedelta(days=7)
    since = history_since(runtime_state)  # the timeline: within the lookback window
    actions = audit.entries(store, node=name, since=min(since, week), limit=200)
    history = store.findings(node=name, since=since, limit=200)
    timeline = sorted(
        [*map(_finding_item, history), *(_action_item(a) for a in actions if a.at >= since)],
        key=lambda i: i.at,
        reverse=True,
    )
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
        rma_archives=archives(store, node=name, limit=10),
    )
