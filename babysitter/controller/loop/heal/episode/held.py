"""The phases that hold a node drained for a human (ledger.py HELD: failed, timed_out,
inspect, lemon, dry_run), and a `resetting` node back in service: the episode waits, and
ends when someone returns the node to service (`babysitter resume`)."""

from __future__ import annotations

from babysitter.controller.loop.heal.episode.base import LEMON_CONDITION, HealerBase, Tick
from babysitter.controller.loop.read.ledger import Remediation


def held(h: HealerBase, rem: Remediation, tick: Tick) -> None:
    """Held for a human: nothing to do until the node is back in service."""
    if h.in_service(rem.node):
        returned_by_admin(h, rem, tick)


def returned_by_admin(h: HealerBase, rem: Remediation, tick: Tick) -> None:
    """Someone returned the node (`babysitter resume`): the episode is over, the row closed
    in its phase. A reset or fabric restart still ordered is withdrawn with it (the order is
    this open row); its late answer must not fail the rung and drain a node in service
    behind the admission step (found by the safety invariants)."""
    h.ledger.close(rem, tick.now, f"{rem.outcome}; node returned to service by an admin")
    h.open.pop(rem.node, None)
    tick.clearing.append((rem.node, LEMON_CONDITION))
    tick.clearing.append((rem.node, "remediation_inspect"))
