"""Lemons for the faults no rung addresses (an intermittent SDC mismatch, a flapping port): the
policy drains such a node and resumes it once its checks are clean, again and again. Its
`lemon_node` escalation (lemon_drains babysitter drains within lemon_window_days) makes the
ledger's lemon of it: the node stays drained for an admin, whose `ledger clear` starts the count
again. A node with a fault the ladder addresses is counted by the ledger instead (automatic rungs
carried out, controller/loop/read/ledger.py), so the policy's drain count never makes it a lemon
early."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select

from babysitter.controller.db import models as m
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.policy_read import policy_rows
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.ladder import remediable
from babysitter.controller.loop.read.ledger import Ledger, Phase
from babysitter.finding import Finding


def policy_drains(store: Store, node: str, since: datetime) -> tuple[int, str]:
    """The policy's drains of NODE carried out since `since`, and the latest one's reason."""
    a = m.actions.c
    q = (
        select(func.count(), func.max(a.id))
        .select_from(m.actions)
        .where(
            a.node == node,
            a.kind == str(ActionKind.DRAIN),
            a.status == str(ActionStatus.DONE),
            a.requested_by == "policy",
            a.done_at >= since,
        )
    )
    with store.engine.connect() as c:
        n, last = c.execute(q).one()
        why = c.execute(select(a.reason).where(a.id == last)).scalar() if last else ""
    return int(n), str(why or "")


def _cleared_at(ledger: Ledger, node: str) -> datetime | None:
    for r in ledger.history(node, limit=50):
        if r.state is Phase.CLEARED:
            return r.created_at
    return None


def _laddered(ledger: Ledger, node: str, since: datetime) -> bool:
    """The ladder has worked on NODE since `since`: its drains were for faults a rung addresses,
    whatever is open right now (a reboot clears the XID that drained it, and the policy's drain
    count must not make a lemon of a node the ledger is healing)."""
    return any(
        r.state is not Phase.CLEARED and r.created_at >= since
        for r in ledger.history(node, limit=50)
    )


@dataclass(frozen=True)
class DrainLemon:
    drains: int
    findings: list[Finding]  # open now (none when the fault is gone for now)
    last_reason: str  # the latest drain's


def drain_lemons(
    store: Store, nodes: Collection[str], now: datetime, window_days: float, limit: int
) -> dict[str, DrainLemon]:
    """Of NODES (drained by babysitter, the policy asking for a lemon), those that are one:
    no fault a rung addresses, and `limit` policy drains within the window since the last
    ledger clear."""
    if not nodes:
        return {}
    ledger = Ledger(store)
    out: dict[str, DrainLemon] = {}
    for row in policy_rows(store, sorted(nodes)):
        findings = list(row["open_findings"])
        if any(remediable(f) for f in findings):
            continue  # the ladder's: its count is the ledger's
        node = row["name"]
        since = now - timedelta(days=window_days)
        cleared = _cleared_at(ledger, node)
        start = max(since, cleared) if cleared else since
        if _laddered(ledger, node, start):
            continue  # the ladder's too: its count is the ledger's
        n, why = policy_drains(store, node, start)
        if n >= limit:
            out[node] = DrainLemon(n, findings, why)
    return out
