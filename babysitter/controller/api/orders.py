"""Orders for agents, handed out in the answer to their reports: a node learns what the
controller wants from it without a request of its own (10,000 nodes polling would double the
controller's load). The orders live in the database (controller/loop/sdc/schedule.py writes SDC
tests, controller/loop/heal/healer.py GPU resets: an open ledger row in phase `resetting`,
controller/loop/heal/fabric_rung.py fabric restarts, controller/loop/heal/rma.py RMA evidence),
so any controller replica answers with them; each replica re-reads them at most once a second
on a thread of its own, and the report path only looks a node up in a dict.

An order cannot outlive its permission (controller/loop/admit/order_permission.py): each carries its
node, its episode (the ledger row) and when it expires; at every refresh the book leaves out
the orders of a node in a maintenance window or under someone else's Slurm reason, and those
answered already; at every hand-out it leaves out the expired ones. Kept server-side, an order
is bound to its node by the report it answers: only a node's own token (HMAC of the cluster
secret and its name, controller/api/auth.py) may report as that node, so node B's answer never
carries node A's orders."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from babysitter.config import Config
from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store, aware
from babysitter.controller.loop.admit.order_permission import (
    EXPIRES_AT,
    OWNER_UNKNOWN,
    answered,
    expiry,
    withheld,
)
from babysitter.controller.loop.heal.fabric_rung import ORDER as FABRIC_ORDER
from babysitter.controller.loop.heal.rma import ORDER as RMA_ORDER
from babysitter.controller.loop.heal.rma import ORDERED as RMA_ORDERED
from babysitter.controller.loop.read.ledger import Phase

log = logging.getLogger(__name__)
REFRESH_S = 1.0
SDC_CHECK = "sdc.matmul"
RESET_ORDER = "gpu.reset"  # the agent's babysitter/agent/reset.py ORDER
RESET_TTL_S = 300.0  # [remediation] reset_timeout_s's default
RMA_TTL_S = 1800.0  # [rma] collect_timeout_s's default
PREFIX = "babysitter:"  # [slurm] reason_prefix's default

Entry = tuple[float | None, bytes]  # (when it expires, epoch s; None: never), its JSON


class OrderBook:
    def __init__(
        self,
        store: Store,
        refresh_s: float = REFRESH_S,
        sdc: bool = True,
        prefix: str = PREFIX,
        reset_ttl_s: float = RESET_TTL_S,
        rma_ttl_s: float = RMA_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.sdc = sdc
        self.refresh_s = refresh_s
        self.prefix = prefix
        self.reset_ttl_s = reset_ttl_s  # a reset's or fabric restart's, from when it was issued
        self.rma_ttl_s = rma_ttl_s  # an RMA collection's, from when it was ordered
        self.clock = clock  # the hand-out's clock (wall time: the orders' expiry is)
        self._orders: dict[str, list[Entry]] = {}  # node -> its orders
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, store: Store, cfg: Config) -> OrderBook:
        return cls(
            store,
            sdc=cfg.checks.sdc.enabled,
            prefix=cfg.slurm.reason_prefix,
            reset_ttl_s=cfg.remediation.reset_timeout_s,
            rma_ttl_s=cfg.rma.collect_timeout_s,
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="orders", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # the database away: keep the last orders, try again
                # (each still expires at its hand-out; no report is stored meanwhile either)
                log.warning("cannot read agent orders: %s", exc)
            self._stop.wait(self.refresh_s)

    def refresh(self) -> None:
        orders: dict[str, list[tuple[datetime | None, dict[str, Any]]]] = {}
        with self.store.engine.connect() as c:
            if self.sdc:
                t = m.sdc_schedule
                for node, oid in c.execute(
                    select(t.c.node, t.c.order_id).where(t.c.order_id.is_not(None))
                ):
                    # bound to its node; its expiry is the SDC hold's (the scheduler clears
                    # the order at its result timeout, the book drops it within a second)
                    orders.setdefault(node, []).append(
                        (None, {"check": SDC_CHECK, "id": oid, "node": node})
                    )
            for node, at, order in [*self._rungs(c), *self._rma(c)]:
                orders.setdefault(node, []).append((at, order))
        held = withheld(self.store, orders.keys(), self.prefix)
        book: dict[str, list[Entry]] = {}
        for node, out in orders.items():
            why = held.get(node)
            for at, o in out:
                if why and not (why == OWNER_UNKNOWN and o["check"] == SDC_CHECK):
                    log.debug("order %s for %s withheld: %s", o["id"], node, why)
                    continue
                if at is not None:
                    o[EXPIRES_AT] = at.isoformat()
                body = json.dumps(o, separators=(",", ":")).encode()
                book.setdefault(node, []).append((at.timestamp() if at else None, body))
        self._orders = book

    def _rungs(self, c: Connection) -> list[tuple[str, datetime | None, dict[str, Any]]]:
        """GPU resets and fabric restarts: open ledger rows in phase `resetting`, not answered."""
        r = m.remediations
        out = []
        for rid, node, uuid, evidence in c.execute(
            select(r.c.id, r.c.node, r.c.gpu_uuid, r.c.evidence)
            .where(r.c.open.is_(True))
            .where(r.c.state == Phase.RESETTING.value)
        ):
            ev = evidence or {}
            if not ev.get("order_id") or answered(ev):
                continue
            at = expiry(ev, self.reset_ttl_s)
            bound = {"id": ev["order_id"], "node": node, "episode": rid}
            if ev.get("order") == FABRIC_ORDER:  # fabric_rung.py
                o = {"check": FABRIC_ORDER, **bound, "units": ev.get("units") or []}
            else:
                o = {
                    "check": RESET_ORDER,
                    **bound,
                    "uuid": uuid or "",
                    "bus_id": ev.get("bus_id") or "",
                }
            out.append((node, aware(at), o))
        return out

    def _rma(self, c: Connection) -> list[tuple[str, datetime | None, dict[str, Any]]]:
        """RMA evidence (controller/loop/heal/rma.py): ordered, not collected yet."""
        t = m.rma_archives
        out = []
        for node, oid, ledger_id, created in c.execute(
            select(t.c.node, t.c.order_id, t.c.ledger_id, t.c.created_at).where(
                t.c.state == RMA_ORDERED
            )
        ):
            at = aware(created)
            until = at + timedelta(seconds=self.rma_ttl_s) if at else None
            o = {"check": RMA_ORDER, "id": oid, "node": node, "episode": ledger_id}
            out.append((node, until, o))
        return out

    def answer_part(self, node: str) -> bytes:
        """What to add to a report's answer for `node` (b"" when nothing is ordered): its
        orders that have not expired by now."""
        entries = self._orders.get(node)
        if not entries:
            return b""
        now = self.clock()
        live = [body for until, body in entries if until is None or now < until]
        return b',"orders":[' + b",".join(live) + b"]" if live else b""
