"""resetting: a GPU reset (or a fabric service restart, fabric_rung.py) was ordered from the
node's agent. Its answer in the agent's report metrics moves the row on: done -> validation
(validating.py); refused or failed -> the next rung; no answer within reset_timeout_s -> the
next rung. A node someone returned to service meanwhile ends the episode (held.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from babysitter.controller.db.actions import ActionKind
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.heal import after_rung
from babysitter.controller.loop.heal.episode.base import HealerBase, Tick
from babysitter.controller.loop.heal.episode.fail import fail
from babysitter.controller.loop.heal.episode.held import returned_by_admin
from babysitter.controller.loop.heal.episode.validating import validate_fresh
from babysitter.controller.loop.read.ledger import Remediation

RESET_METRIC = "gpu_reset"  # the agent's answer to a reset order, in its report metrics


def resetting(h: HealerBase, rem: Remediation, tick: Tick) -> None:
    """The order's answer, or the node back in service."""
    if h.in_service(rem.node):
        returned_by_admin(h, rem, tick)
    elif rem.rung is Rung.RESTART_FABRIC:
        _fabric_restarted(h, rem, tick)
    else:
        _gpu_reset(h, rem, tick)


def _fabric_restarted(h: HealerBase, rem: Remediation, tick: Tick) -> None:
    """The same as a reset's, for a fabric service restart."""
    got = h.fabric_rung.answer(rem, tick.now)
    if got is not None and got[0]:
        why = f"after a fabric service restart: {rem.fault}"
        validate_fresh(h, rem, tick.now, why, tick.firing, rem.evidence["restart_done_at"])
    elif got is not None:
        fail(h, rem, tick.now, got[1], tick.firing)


def _gpu_reset(h: HealerBase, rem: Remediation, tick: Tick) -> None:
    now, ev = tick.now, rem.evidence
    if "reset_done_at" in ev:  # done; waits for a full report, or its validation was held
        validate_fresh(
            h, rem, now, f"after GPU reset: {rem.fault}", tick.firing, ev["reset_done_at"]
        )
        return
    row = h.store.node(rem.node) or {}
    got = (row.get("metrics") or {}).get(RESET_METRIC)
    if isinstance(got, dict) and got.get("order") == ev.get("order_id"):
        _reset_answered(h, rem, tick, got)
        return
    issued = datetime.fromisoformat(ev["issued_at"])
    if (now - issued).total_seconds() > h.cfg.reset_timeout_s:
        why = f"the agent did not answer the reset order in {h.cfg.reset_timeout_s:g} s"
        fail(h, rem, now, why, tick.firing)


def _reset_answered(h: HealerBase, rem: Remediation, tick: Tick, got: dict[str, Any]) -> None:
    """The agent's answer `got` to this row's order: done -> validation, else the next rung."""
    now = tick.now
    message = str(got.get("message") or "")[:300]
    if not got.get("ok"):
        # a refused reset never ran: it is no remediation for the lemon count
        rem.evidence["refused"] = bool(got.get("refused"))
        fail(h, rem, now, f"agent: {message}", tick.firing)
        return
    h.ledger.move(
        rem,
        rem.state,
        now,
        message,
        reset_done_at=now.isoformat(),
        reset_duration_s=got.get("duration_s"),
        **after_rung.mark(h.store, rem.node),
    )
    h.record(ActionKind.RESET_GPU, rem.node, f"reset_gpu: {rem.fault}", message, rem.id)
    validate_fresh(h, rem, now, f"after GPU reset: {rem.fault}", tick.firing, now.isoformat())
