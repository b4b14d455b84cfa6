"""After a GPU reset or a fabric service restart, the node is validated only once its open
findings come from a full report sent after the agent's answer.

Why: the agent answers the order in an *event* report, and the controller merges an event
report into the node's open findings instead of replacing them (controller/api/ingest.py), so
the fault the rung was for (an XID 74) stays open until the agent's next *full* report. A
validation that passed before that report returned the node to service with the stale fault
still open; the policy drained it again on it, and a second reset followed (a remediation too
many, counted toward the lemon limit). No full report within the heartbeat timeout of the
answer: the node's state after the rung is unknown, the rung failed (never validated and
resumed on unknown).

The answer's own report marks the point: a full report counts when it was received no earlier
and sent (on the agent's clock, like the mark) no earlier than it; an answer that came in a full
report is its own fresh report. And the fault the rung was for must not be open as observed
before the answer (the agent's clock again): a full report built before the agent's checks ran
again after the reset still carries the kernel log's XID from before it. Seen anew after the
answer it is evidence, and the validation decides.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select

from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store, aware
from babysitter.controller.loop.read.ledger import Remediation

SENT = "answer_sent_at"  # evidence keys: the answer's report, on the agent's clock
RECEIVED = "answer_received_at"  # ... and on the controller's


def mark(store: Store, node: str) -> dict[str, Any]:
    """Evidence for the ledger row when the agent's answer is seen: when the report that
    carried it (the node's newest applied report) was sent and received."""
    row = store.node(node) or {}
    rid = row.get("last_report_id")
    with store.engine.connect() as c:
        got = c.execute(
            select(m.reports.c.sent_at, m.reports.c.received_at).where(
                m.reports.c.report_id == str(rid)
            )
        ).first()
    if got is None:  # pruned or never there: no mark, every later full report counts
        return {}
    sent, received = aware(got.sent_at), aware(got.received_at)
    assert sent is not None and received is not None
    return {SENT: sent.isoformat(), RECEIVED: received.isoformat()}


def fresh(store: Store, node: str, ev: dict[str, Any], done_at: str) -> bool:
    """A full report sent after the answer was applied (`done_at`: when the controller saw
    the answer, for a row recorded without a mark)."""
    r = m.reports.c
    received = datetime.fromisoformat(str(ev.get(RECEIVED) or done_at))
    q = select(r.id).where(r.node == node, r.kind == "full", r.received_at >= received)
    if SENT in ev:
        q = q.where(r.sent_at >= datetime.fromisoformat(str(ev[SENT])))
    with store.engine.connect() as c:
        return c.execute(q.limit(1)).first() is not None


def stale(store: Store, node: str, ev: dict[str, Any], fault_class: str) -> bool:
    """The rung's fault is among the node's open findings as observed before the answer."""
    if SENT not in ev:
        return False
    answered = datetime.fromisoformat(str(ev[SENT]))
    row = store.node(node) or {}
    return any(
        f.code == fault_class and f.observed_at < answered for f in row.get("open_findings", [])
    )


def waiting(
    store: Store, rem: Remediation, done_at: str, now: datetime, timeout_s: float
) -> str | None:
    """None: the node's findings are fresh, validate. "": wait for the agent's full report.
    Else why the rung failed (none within `timeout_s` of the answer)."""
    ev = rem.evidence
    if fresh(store, rem.node, ev, done_at) and not stale(store, rem.node, ev, rem.fault_class):
        return None
    if (now - datetime.fromisoformat(done_at)).total_seconds() > timeout_s:
        return (
            f"no full report from the agent without the {rem.fault_class} from before its "
            f"answer within {timeout_s:g} s"
        )
    return ""
