"""Whether an order to a node's agent still has its permission (issue 49, side door 3).

An order (a GPU reset, a fabric service restart, an RMA evidence collection) is bound to its
node, its episode (the ledger row that asked for it) and an expiry: the rung's timeout from
when it was issued, fixed at that moment in the order's evidence (`expires_at`). It is handed
out only while all of these hold, checked every time (controller/api/orders.py), and the
controller orders RMA evidence only under the same conditions (controller/loop/heal/rma.py):

- the node is in no open maintenance window (maintenance.py's `nodes_in_maintenance`, the
  predicate the loop itself reads);
- the node's current Slurm reason is babysitter's automatic one, or none (ownership.py's
  `episode_owner`, the one reason-ownership predicate), as the loop last mirrored Slurm into
  the node's row (`nodes.slurm_reason`, written every tick it changes): the order book runs on
  every replica, with no Slurm client of its own, and reads the database once a second;
- the order has not expired, and has not been answered.

An expired order is over for the healer too, even while the node is in maintenance (where it
takes no other step): see `Healer` (controller/loop/heal/healer.py).

The orders are issued here and nowhere else (`issue`, `order_rma`), each right after its
permission was asked: tests/test_admission_is_the_only_door.py fails where a controller module
writes one itself."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from babysitter.controller.db import audit
from babysitter.controller.db import models as m
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.store import Store
from babysitter.controller.loop.admit.admission import Act, Admission, Refusal
from babysitter.controller.loop.admit.maintenance import nodes_in_maintenance
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.decide.ownership import Owner, episode_owner
from babysitter.controller.loop.read.ledger import Ledger, Phase, Remediation
from babysitter.slurm.client import SlurmNode

EXPIRES_AT = "expires_at"  # the evidence key (ISO 8601), and the order's field on the wire
# evidence keys set when the agent's answer is in: the order is no longer out
ANSWERED = ("reset_done_at", "restart_done_at")
IN_MAINTENANCE = "in a maintenance window"
OTHER_OWNER = "someone else's Slurm reason"
OWNER_UNKNOWN = "its Slurm reason is not known yet"
# where the agent answers a reset / a fabric restart in its report metrics (healer.py's
# RESET_METRIC, fabric_rung.py's METRIC: both import this module)
ANSWER_METRICS = ("gpu_reset", "fabric_restart")

# the healer's record of an action: kind, node, reason, outcome, ledger row, status
Record = Callable[[ActionKind, str, str, str, int, ActionStatus], None]


def expiry(evidence: dict[str, Any], ttl_s: float) -> datetime | None:
    """When the order of a ledger row's evidence expires: its own `expires_at`, or (an order
    an older controller issued) its `issued_at` plus the rung's timeout; None: no order."""
    if raw := evidence.get(EXPIRES_AT):
        return datetime.fromisoformat(str(raw))
    if raw := evidence.get("issued_at"):
        return datetime.fromisoformat(str(raw)) + timedelta(seconds=ttl_s)
    return None


def stamp(now: datetime, ttl_s: float) -> dict[str, str]:
    """The evidence an order is issued with: when, and when it expires."""
    return {"issued_at": now.isoformat(), EXPIRES_AT: (now + timedelta(seconds=ttl_s)).isoformat()}


def answered(evidence: dict[str, Any]) -> bool:
    return any(k in evidence for k in ANSWERED)


def withheld(store: Store, nodes: Collection[str], prefix: str) -> dict[str, str]:
    """The nodes of `nodes` no node-changing order may reach now, each with why."""
    if not nodes:
        return {}
    quiet = nodes_in_maintenance(store)
    out = {n: IN_MAINTENANCE for n in nodes if n in quiet}
    rest = sorted(set(nodes) - out.keys())
    t = m.nodes.c
    with store.engine.connect() as c:
        rows = {
            name: (state, reason)
            for name, state, reason in c.execute(
                select(t.name, t.slurm_state, t.slurm_reason).where(t.name.in_(rest))
            )
        }
    for n in rest:
        state, reason = rows.get(n, (None, None))
        # never mirrored (no tick has seen the node in Slurm): nobody can say whose it is
        sn = None if state is None else SlurmNode(n, str(state), reason=reason or "")
        owner = episode_owner(sn, prefix)
        if owner is Owner.OTHER:
            out[n] = OTHER_OWNER
        elif owner is Owner.UNKNOWN:
            out[n] = OWNER_UNKNOWN
    return out


def expire_quiet(
    ledger: Ledger, rem: Remediation, now: datetime, ttl_s: float, record: Record
) -> bool:
    """An order out to a node in a maintenance window, past its expiry and unanswered: its
    rung timed out. The episode is closed (`timed_out`) and recorded as failed, with no Slurm
    call, no next rung and no page: the node is the admin's while the window lasts; after it,
    the healer starts afresh from the node's open findings. An answer the agent sent in time
    waits for the window's end like every other step. True when it closed the episode."""
    ev = rem.evidence
    if rem.state is not Phase.RESETTING or not ev.get("order_id") or answered(ev):
        return False
    until = expiry(ev, ttl_s)
    if until is None or now < until:
        return False
    metrics = (ledger.store.node(rem.node) or {}).get("metrics") or {}
    if any(
        isinstance(got := metrics.get(k), dict) and got.get("order") == ev["order_id"]
        for k in ANSWER_METRICS
    ):
        return False
    why = f"order expired at {until.isoformat()} unanswered, the node in a maintenance window"
    ledger.move(rem, Phase.TIMED_OUT, now, why, expired_in_maintenance=True)
    ledger.close(rem, now, why)
    kind = ActionKind.RESTART_FABRIC if rem.rung is Rung.RESTART_FABRIC else ActionKind.RESET_GPU
    record(kind, rem.node, rem.fault, why, rem.id, ActionStatus.FAILED)
    return True


def issue(
    admission: Admission | None,
    ledger: Ledger,
    rem: Remediation,
    act: Act,
    now: datetime,
    ttl_s: float,
    message: str,
    **evidence: Any,
) -> Refusal | None:
    """Order a GPU reset or a fabric service restart (`act`) from the node's agent: asked of
    the admission step first (ownership, maintenance, on the node's state read right now);
    admitted, the episode's ledger row becomes the order, with its id and its expiry. The
    refusal when held (asked again next tick)."""
    if admission is not None and (held := admission.one(act, rem.node, now)):
        return held
    order_id = str(uuid.uuid4())
    ledger.move(
        rem, Phase.RESETTING, now, message, order_id=order_id, **evidence, **stamp(now, ttl_s)
    )
    return None


def order_rma(
    store: Store, prefix: str, rem: Remediation, why: str, now: datetime, state: str
) -> str | None:
    """Order RMA evidence for `rem`'s node from its agent, unless the node is in maintenance
    or under someone else's reason (a reason not mirrored yet is left to the order book,
    which holds the order till it is): why not, or None when ordered (its row in `state`)."""
    held = withheld(store, {rem.node}, prefix).get(rem.node, OWNER_UNKNOWN)
    if held != OWNER_UNKNOWN:
        return held
    oid = str(uuid.uuid4())
    aid = store.record_action(
        ActionKind.EVIDENCE,
        node=rem.node,
        reason=why,
        rule=Rule.REMEDIATION,
        requested_by="policy",
        status=ActionStatus.RUNNING,
        outcome=f"ordered from the node's agent (order {oid}, ledger row {rem.id})",
    )
    row = {"node": rem.node, "ledger_id": rem.id, "trigger": why, "order_id": oid}
    with store.engine.begin() as c:
        c.execute(
            m.rma_archives.insert().values(
                **row, action_id=aid, state=state, alerted=False, created_at=now, updated_at=now
            )
        )
    audit.record_actions(store, [aid], now)
    return None
