"""A node that became a lemon (too many remediations, or too many drains no rung addresses,
within the window): a ledger row in phase `lemon` that holds it drained for an admin, its
lemon drain reason, and the alert asserted every tick until an admin clears the ledger."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from babysitter.controller.db.actions import ActionKind
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.heal.episode.base import LEMON_CONDITION, HealerBase, log
from babysitter.controller.loop.heal.episode.fault import Fault
from babysitter.controller.loop.heal.lemons import DrainLemon
from babysitter.controller.loop.read.ledger import Phase, Remediation
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Action, Severity
from babysitter.slurm.client import SlurmError


def lemon_by_count(
    h: HealerBase,
    node: str,
    fault: Fault,
    past: list[Remediation],
    now: datetime,
    common: dict[str, Any],
) -> None:
    """`past`, the remediations counted in the window, reached the limit: no more rungs."""
    common["evidence"]["history"] = [
        {
            "at": r.created_at.isoformat(),
            "rung": r.rung.value,
            "fault": r.fault_class,
            "state": r.state.value,
        }
        for r in past
    ]
    days = f"{h.cfg.lemon_window_days:g} days"
    make_lemon(h, node, fault, f"{len(past)} remediations in {days}", now, common)


def make_lemon(
    h: HealerBase, node: str, fault: Fault, count: str, now: datetime, common: dict[str, Any]
) -> None:
    """`count` ("3 remediations in 7 days", "3 drains in 7 days") made NODE a lemon."""
    why = f"lemon: {count}, {fault.summary}"
    common["evidence"]["lemon"] = count
    rem = h.ledger.add(
        node,
        Rung.INSPECT,
        fault.klass,
        fault.summary,
        Phase.LEMON,
        now,
        outcome="no more automatic rungs: stays drained for an admin",
        **common,
    )
    try:
        h.admitted.drain(node, why, now)
        h.snapshot.moved_here([(node, why)], [])
        h.store.set_node(node, babysitter_drained=True, drain_reason=why)
        done = "drained with a lemon reason"
    except SlurmError as exc:
        done = f"could not set the lemon reason: {exc}"
    h.record(ActionKind.LEMON, node, why, done, rem.id)
    h.open[node] = rem
    log.warning("%s: %s", node, why)


def drain_lemon(h: HealerBase, node: str, lemon: DrainLemon, now: datetime) -> None:
    """A fault no rung addresses drained the node again and again (loop/heal/lemons.py)."""
    worst = max(lemon.findings, key=lambda f: f.severity.rank, default=None)
    fault = (
        Fault.of(worst)
        if worst
        else Fault("drain", Action.DRAIN, lemon.last_reason[:300], None, None, None)
    )
    count = f"{lemon.drains} drains in {h.lemon_drains[1]:g} days"
    make_lemon(h, node, fault, count, now, fault.common())


def lemon_alert(h: HealerBase, rem: Remediation) -> Alert:
    """The lemon's page, from its ledger row (its history, its RMA evidence once stored)."""
    history = rem.evidence.get("history", [])
    # its RMA evidence archive, once stored (controller/loop/heal/rma.py links it here)
    archive = rem.evidence.get("rma_archive")
    return Alert(
        rem.node,
        LEMON_CONDITION,
        Severity.CRITICAL,
        f"{rem.node} is a lemon: "
        + rem.evidence.get(
            "lemon", f"{len(history)} remediations in {h.cfg.lemon_window_days:g} days"
        )
        + f" (latest: {rem.fault})",
        "stays drained; no more automatic remediation until an admin clears the ledger"
        + (f"; RMA evidence: {archive}" if archive else ""),
        rem.created_at,
        details={"history": history, **({"rma_archive": archive} if archive else {})},
    )
