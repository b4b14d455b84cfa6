"""The gauges on-call alerts read, set from the store when /metrics is scraped: the guard,
babysitter's drains and the oldest one, each drained node's age by owner and remediation,
silent nodes, firing alerts by condition, nodes in maintenance. A store that cannot be read
raises: /metrics then publishes `babysitter_store_up 0` and withdraws these values
(controller/api/api_health.py) instead of reading as healthy."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select

from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store, aware
from babysitter.controller.loop.read.guard import GUARD_KEY
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.slurm.ownership import ReasonOwner, mark_owner, reason_owner


def refresh(
    store: Store, metrics: ControllerMetrics, runtime_state: dict[str, Any], now: datetime
) -> None:
    n = m.nodes
    timeout = timedelta(seconds=float(runtime_state.get("heartbeat_timeout_s", 120)))
    with store.engine.connect() as c:
        drained, oldest = c.execute(
            select(func.count(), func.min(n.c.drained_at)).where(n.c.babysitter_drained)
        ).one()
        silent = c.execute(
            select(func.count()).where(n.c.last_report_at < now - timeout)
        ).scalar_one()
        firing: dict[str, int] = {
            str(cond): int(count)
            for cond, count in c.execute(
                select(m.alerts.c.condition, func.count())
                .where(m.alerts.c.state == "firing")
                .group_by(m.alerts.c.condition)
            )
        }
        drains = c.execute(
            select(
                n.c.name, n.c.babysitter_drained, n.c.drain_reason, n.c.slurm_reason, n.c.drained_at
            ).where(or_(n.c.babysitter_drained, n.c.slurm_state.contains("DRAIN")))
        ).all()
        remediating: dict[str, str] = {
            str(node): str(state)  # the newest open episode wins
            for node, state in c.execute(
                select(m.remediations.c.node, m.remediations.c.state)
                .where(m.remediations.c.open.is_(True))
                .order_by(m.remediations.c.id)
            )
        }
        windows = c.execute(
            select(m.maintenance_windows.c.nodes).where(m.maintenance_windows.c.state == "active")
        ).all()
    metrics.guard_tripped.set(1 if store.kv_get(GUARD_KEY, False) else 0)
    metrics.drained.set(drained)
    since = aware(oldest)
    metrics.oldest_drain_age.set(0 if since is None else max(0.0, (now - since).total_seconds()))
    metrics.silent.set(silent)
    prefix = str(runtime_state.get("reason_prefix") or "babysitter:")
    # nodes resumed since the last scrape drop out (their alerts resolve)
    metrics.node_drained.clear()
    for name, ours, reason, slurm_reason, at in drains:
        since = aware(at)
        if since is None:
            continue  # drained before this controller saw it: its age is unknown
        who = owner(bool(ours), reason or "", slurm_reason or "", prefix)
        metrics.node_drained.labels(name, who, remediating.get(name, "none")).set(
            max(0.0, (now - since).total_seconds())
        )
    # conditions that stopped firing go back to 0 (the series stays, so alerts resolve)
    for cond in {*firing, *_seen(metrics)}:
        metrics.firing.labels(cond).set(firing.get(cond, 0))
    metrics.maintenance.set(len({name for (names,) in windows for name in names or []}))


def _seen(metrics: ControllerMetrics) -> set[str]:
    return {s.labels["condition"] for fam in metrics.firing.collect() for s in fam.samples}


def owner(babysitter_drained: bool, drain_reason: str, slurm_reason: str, prefix: str) -> str:
    """Who a drain belongs to: `admin` (`babysitter drain`, marked [manual]; babysitter never
    resumes it), `babysitter` (its policy, healer or HealthCheckProgram mode), else `other`.
    Slurm's reason decides when the leader has written it (it carries the prefix); before
    that, what babysitter recorded when it drained (its reason, without the prefix)."""
    if slurm_reason:
        who = reason_owner(slurm_reason, prefix)
        if who is ReasonOwner.FOREIGN:
            return "other"
        return "admin" if who is ReasonOwner.MANUAL else "babysitter"
    if mark_owner(drain_reason.removeprefix(prefix).lstrip()) is ReasonOwner.MANUAL:
        return "admin"
    return "babysitter" if babysitter_drained else "other"
