"""Orders for agents, handed out in the answer to their reports: a node learns what the
controller wants from it without a request of its own (10,000 nodes polling would double the
controller's load). The orders live in the database (controller/sdc_schedule.py writes them),
so any controller replica answers with them; each replica re-reads them at most once a second
on a thread of its own, and the report path only looks a node up in a dict."""

from __future__ import annotations

import json
import logging
import threading

from sqlalchemy import select

from babysitter.controller import models as m
from babysitter.controller.store import Store

log = logging.getLogger(__name__)
REFRESH_S = 1.0
SDC_CHECK = "sdc.matmul"


class OrderBook:
    def __init__(self, store: Store, refresh_s: float = REFRESH_S) -> None:
        self.store = store
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
        t = m.sdc_schedule
        with self.store.engine.connect() as c:
            rows = c.execute(select(t.c.node, t.c.order_id).where(t.c.order_id.is_not(None)))
            self._orders = {
                node: b',"orders":'
                + json.dumps([{"check": SDC_CHECK, "id": oid}], separators=(",", ":")).encode()
                for node, oid in rows
            }

    def answer_part(self, node: str) -> bytes:
        """What to add to a report's answer for `node` (b"" when nothing is ordered)."""
        return self._orders.get(node, b"")
