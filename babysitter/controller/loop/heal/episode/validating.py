"""-> validating, and out of it: a rung done (a reboot back, a reset or fabric restart
answered) starts the validation job (validation.py) in the node's reservation; its verdict
ends the episode in `passed` (the validator resumed the node) or fails the rung."""

from __future__ import annotations

from datetime import datetime, timedelta

from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.episodes import state_of, validated_for_this_drain
from babysitter.controller.loop.admit.admission import Refusal, Why
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.heal import after_rung
from babysitter.controller.loop.heal.episode.base import HealerBase, Tick, log
from babysitter.controller.loop.heal.episode.fail import fail
from babysitter.controller.loop.read.ledger import Phase, Remediation
from babysitter.controller.loop.record.alerts import Alert


def validate_fresh(
    h: HealerBase, rem: Remediation, now: datetime, why: str, firing: list[Alert], done_at: str
) -> None:
    """After a reset / restart: validated once the agent's full report after its answer
    is in, never on the stale findings its event answer left open (after_rung.py)."""
    wait = after_rung.waiting(h.store, rem, done_at, now, h.heartbeat_s)
    if wait is None:
        # no reservation holds the node yet: a start held this long is given up (paged)
        held_until = datetime.fromisoformat(done_at) + timedelta(minutes=h.validation_minutes)
        validate(h, rem, now, why, firing, held_until)
    elif wait:
        fail(h, rem, now, wait, firing)


def validate(
    h: HealerBase,
    rem: Remediation,
    now: datetime,
    why: str,
    firing: list[Alert],
    held_until: datetime | None = None,
) -> None:
    """The rung is done: the validation job must pass before the node returns.
    `held_until`: when a start still held (unknown, e.g. Slurm will not return the node
    yet) fails the rung instead; a reboot's is the end of its reservation."""
    reserved = None
    if rem.rung is Rung.REBOOT and "issued_at" in rem.evidence:
        # the reservation the reboot was issued with (waiting.py), not one for the job alone
        minutes = int(h.cfg.reboot_timeout_s // 60) + h.validation_minutes
        reserved = datetime.fromisoformat(rem.evidence["issued_at"]) + timedelta(minutes=minutes)
        held_until = reserved
    outcome = h.validator.start(rem.node, why, now, reserved_until=reserved)
    if isinstance(outcome, Refusal):
        if outcome.why is Why.UNKNOWN and held_until is not None and now >= held_until:
            # Slurm never let it start while the node was held for it: paged, stays drained
            fail(h, rem, now, f"validation never started: {outcome.reason}", firing)
            return
        # held by the admission step, not a failed rung: the phase stays, asked next tick
        h.ledger.move(rem, rem.state, now, f"validation {outcome}")
        return
    aid = _validation_action(h, rem.node)
    if aid is None:
        fail(h, rem, now, outcome, firing)
        return
    h.ledger.move(
        rem,
        Phase.VALIDATING,
        now,
        outcome,
        validation_action=aid,
        validation_started_at=now.isoformat(),
    )


def _validation_action(h: HealerBase, node: str) -> int | None:
    for a in h.store.actions(status=ActionStatus.RUNNING, limit=200):
        if a.kind is ActionKind.VALIDATE and a.node == node:
            return a.id
    return None


def validating(h: HealerBase, rem: Remediation, tick: Tick) -> None:
    """validating -> passed (validated, back in service) or failed; running: stays."""
    aid = rem.evidence.get("validation_action")
    # by its id: a busy fleet may record hundreds of actions while one validation runs
    action = h.store.action(int(aid)) if aid is not None else None
    if action is None or action.status is ActionStatus.RUNNING:
        return
    if validated_for_this_drain(state_of(action.status)):
        h.ledger.move(
            rem,
            Phase.PASSED,
            tick.now,
            f"validated and back in service: {action.outcome}",
            resumed_at=tick.now.isoformat(),
        )
        tick.clearing.append((rem.node, "remediation_timeout"))
        log.info("%s: healed by %s and validated", rem.node, rem.rung.value)
        return
    # the validator drained it already, with `validation failed: ...` (this tick's Slurm
    # snapshot predates that drain: it must not be drained again over that reason)
    fail(h, rem, tick.now, str(action.outcome or "validation failed"), tick.firing, drained=True)
