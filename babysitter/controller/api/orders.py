"""Orders for agents, handed out in the answer to their reports: a node learns what the
controller wants from it without a request of its own (10,000 nodes polling would double the
controller's load). The orders live in the database (controller/loop/sdc_schedule.py writes SDC
tests, controller/loop/healer.py GPU resets: an open ledger row in phase `resetting`,
controller/loop/rma.py RMA evidence),
so any controller replica answers with them; each replica re-reads them at most once a second
on a thread of its own, and the report path only looks a node up in a dict."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from sqlalchemy import select

from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store
from babysitter.controller.loop.fabric_rung import ORDER as FABRIC_ORDER
from babysitter.controller.loop.ledger import Phase
from babysitter.controller.loop.rma import ORDER as RMA_ORDER
from babysitter.controller.loop.rma import ORDERED as RMA_ORDERED

log = logging.getLogger(__name__)
REFRESH_S = 1.0
SDC_CHECK = "sdc.matmul"
RESET_ORDER = "gpu.reset"  # the agent's babysitter/agent/reset.py ORDER


class OrderBook:
    def __init__(self, store: Store, refresh_s: float = REFRESH_S, sdc: bool = True) -> None:
        self.store = store
        self.sdc = sdc
        self.refresh_s = refresh_s
        self._orders: dict[str, bytes] = {}  # node -> the answer's `,"orders":[...]` part
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
                log.warning("cannot read agent orders: %s", exc)
            self._stop.wait(self.refresh_s)

    def refresh(self) -> None:
        orders: dict[str, list[dict[str, Any]]] = {}
        t, r = m.sdc_schedule, m.remediations
        with self.store.engine.connect() as c:
            if self.sdc:
                for node, oid in c.execute(
                    select(t.c.node, t.c.order_id).where(t.c.order_id.is_not(None))
                ):
                    orders.setdefault(node, []).append({"check": SDC_CHECK, "id": oid})
            resets = c.execute(
                select(r.c.node, r.c.gpu_uuid, r.c.evidence)
                .where(r.c.open.is_(True))
                .where(r.c.state == Phase.RESETTING.value)
            )
            for node, uuid, evidence in resets:
                ev = evidence or {}
                if ev.get("order_id") and ev.get("order") == FABRIC_ORDER:  # fabric_rung.py
                    units = ev.get("units") or []
                    orders.setdefault(node, []).append(
                        {"check": FABRIC_ORDER, "id": ev["order_id"], "units": units}
                    )
                elif ev.get("order_id"):
                    orders.setdefault(node, []).append(
                        {
                            "check": RESET_ORDER,
                            "id": ev["order_id"],
                            "uuid": uuid or "",
                            "bus_id": ev.get("bus_id") or "",
                        }
                    )
            evidence = c.execute(
                select(m.rma_archives.c.node, m.rma_archives.c.order_id).where(
                    m.rma_archives.c.state == RMA_ORDERED
                )
            )
            for node, oid in evidence:  # RMA evidence (controller/loop/rma.py)
                orders.setdefault(node, []).append({"check": RMA_ORDER, "id": oid})
        self._orders = {
            node: b',"orders":' + json.dumps(o, separators=(",", ":")).encode()
            for node, o in orders.items()
        }

    def answer_part(self, node: str) -> bytes:
        """What to add to a report's answer for `node` (b"" when nothing is ordered)."""
        return self._orders.get(node, b"")
