"""-> failed: the rung did not heal the node. The node is held out of service (drained
through the admission door, its validation reservation ended), the row is closed in phase
`failed`, and the ladder's next rung starts as a new row (start.py)."""

from __future__ import annotations

from datetime import datetime

from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.loop.heal.episode.base import HealerBase, log
from babysitter.controller.loop.heal.episode.fault import Fault
from babysitter.controller.loop.heal.episode.start import climb
from babysitter.controller.loop.heal.validation import reservation_name
from babysitter.controller.loop.read.ledger import Phase, Remediation
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Action
from babysitter.slurm.client import SlurmError


def fail(
    h: HealerBase,
    rem: Remediation,
    now: datetime,
    why: str,
    firing: list[Alert],
    drained: bool = False,
) -> None:
    """The rung did not heal the node: keep it out of service, record it and climb to
    the next rung. `drained`: the validator drained it already (with its own reason)."""
    _hold_out_of_service(h, rem, now, why, drained)
    h.ledger.move(rem, Phase.FAILED, now, why)
    h.ledger.close(rem, now, why)
    h.open.pop(rem.node, None)
    h.record(
        ActionKind(rem.rung.value), rem.node, rem.fault, why, rem.id, status=ActionStatus.FAILED
    )
    action = Action(rem.evidence.get("action") or Action.REBOOT.value)
    nxt = h.ladder.after(rem.fault_class, action, rem.rung)
    fault = Fault(
        rem.fault_class,
        action,
        rem.fault,
        rem.gpu_uuid,
        rem.gpu_serial,
        rem.evidence.get("bus_id"),
    )
    climb(h, rem.node, fault, nxt, now, firing)


def _hold_out_of_service(
    h: HealerBase, rem: Remediation, now: datetime, why: str, drained: bool
) -> None:
    """No validation reservation left, and the node drained with the failed rung's reason
    unless babysitter's drain already holds it."""
    sn = h.snapshot.nodes.get(rem.node)
    try:
        h.admitted.end_validation(reservation_name(rem.node))
        if not drained and (sn is None or not (sn.drained_or_draining and h.ours(sn))):
            reason = f"{rem.rung.value} failed: {why}"
            h.admitted.drain(rem.node, reason, now)
            h.snapshot.moved_here([(rem.node, reason)], [])
            h.store.set_node(rem.node, babysitter_drained=True, drain_reason=reason)
    except SlurmError as exc:
        log.warning("%s: cannot hold the node after a failed %s: %s", rem.node, rem.rung, exc)
