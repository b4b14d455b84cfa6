"""Which of the controller's orders this agent carries out (issue 49, side door 3).

The controller repeats an order in every answer until it sees the result, so the agent must
remember the orders it took: across restarts too, or an agent restarted while its answer is
not in yet (a maintenance window: the controller takes no step there) runs a GPU reset a
second time on a node an admin is working on. The ids it took live in a small JSON file beside
the spool (like the event findings, agent/sticky.py), bounded to the newest `KEEP`, written
before the order is carried out: a crash mid-reset never runs it again. The answers of the
last reset and fabric restart are kept there too, so a restarted agent still reports them.

An order names its node and when it expires (controller/api/orders.py); the agent refuses one
for another node, or one past its expiry by more than `CLOCK_SKEW_S` on its own clock. A
controller of wire 2 from before this change sends neither field: its orders are checked
against the ids taken only."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from babysitter.agent.statefile import read_json, write_atomically

log = logging.getLogger(__name__)

KEEP = 256  # order ids remembered (uuid4s: ~10 KB; a node gets a few orders a week)
# how far the agent's clock may be behind the controller's before a live order reads as
# expired: NTP keeps a cluster within milliseconds, a node whose clock is minutes off is
# better refused (the controller's own expiry then ends the episode) than acting on it
CLOCK_SKEW_S = 30.0
EXPIRES_AT = "expires_at"  # the order's field (controller/loop/admit/order_permission.py)
ONCE = frozenset({"gpu.reset", "fabric.restart", "rma.collect"})  # change the node: never twice


class Verdict(StrEnum):
    CARRY_OUT = "carry_out"
    TAKEN = "taken"  # taken before (this process or one before it): ignored
    REFUSED = "refused"  # not this node's, expired, unreadable: answered as refused


class OrderGate:
    def __init__(
        self, path: Path, node: str, keep: int = KEEP, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path)
        self.node = node
        self.keep = keep
        self.clock = clock
        self._lock = threading.Lock()
        self._taken: dict[str, float] = {}  # id -> when taken (insertion order: oldest first)
        # the ordered checks' (an SDC test): read-only, run again by a restarted agent, which
        # is how the controller gets its answer then; remembered by this process only
        self._seen: dict[str, float] = {}
        self._told: set[str] = set()  # replays already logged by this process
        self.answers: dict[str, dict[str, Any]] = {}  # metric -> the last outcome
        self._load()

    def _load(self) -> None:
        # unreadable: the controller's expiry and maintenance filter still hold
        data = read_json(self.path)
        if not isinstance(data, dict):
            return
        taken = data.get("taken")
        if isinstance(taken, dict):
            self._taken = {str(k): float(v) for k, v in taken.items() if _number(v)}
        answers = data.get("answers")
        if isinstance(answers, dict):
            self.answers = {str(k): v for k, v in answers.items() if isinstance(v, dict)}

    def _save(self) -> None:
        body = json.dumps({"taken": self._taken, "answers": self.answers})
        write_atomically(self.path, body, "the orders taken")

    def admit(self, order: dict[str, Any]) -> tuple[Verdict, str]:
        """Whether to carry `order` out, and why not. A new id is remembered at once (the
        node-changing ones on disk, before they run), whatever the verdict."""
        oid, check = str(order.get("id", ""))[:64], str(order.get("check", ""))[:64]
        once = check in ONCE
        book = self._taken if once else self._seen
        with self._lock:
            if oid in book:
                if oid not in self._told:
                    self._told.add(oid)
                    log.warning("order %s (%s) was taken before: not carried out again", oid, check)
                return Verdict.TAKEN, "taken before"
            book[oid] = self.clock()
            while len(book) > self.keep:
                del book[next(iter(book))]
            self._told.add(oid)
            if len(self._told) > 4 * self.keep:
                self._told = set(self._taken) | set(self._seen)
            if once:
                self._save()
        why = self._why_not(order)
        return (Verdict.REFUSED, why) if why else (Verdict.CARRY_OUT, "")

    def _why_not(self, order: dict[str, Any]) -> str:
        node = order.get("node")
        if node is not None and node != self.node:
            return f"the order is for node {str(node)[:64]}, this is {self.node}"
        raw = order.get(EXPIRES_AT)
        if raw is None:
            return ""  # an older controller's order: no expiry to check
        try:
            until = datetime.fromisoformat(str(raw)).timestamp()
        except ValueError:
            return f"unreadable expiry {str(raw)[:40]!r}"
        late = self.clock() - until
        if late > CLOCK_SKEW_S:
            return f"the order expired {late:.0f} s ago (at {raw})"
        return ""

    def answer(self, metric: str, outcome: dict[str, Any]) -> None:
        """The outcome of a reset / restart, reported until the next one, after restarts too."""
        with self._lock:
            self.answers[metric] = outcome
            self._save()


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
