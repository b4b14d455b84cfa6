"""/metrics whose cost does not grow with the fleet: the values read from the store (nodes by
verdict and by leaf switch, drains, silent nodes, alerts firing, the guard, maintenance) are
read every controller.metrics_interval_s on a thread of their own, rendered once into
Prometheus text and published as an immutable snapshot. A scrape only sends those bytes after
the process's own counters (a fixed number of series): no scrape reads a node row, and any
number of scrapers (two Prometheus replicas, a curl loop) costs the same store reads as none.

A store that cannot be read publishes `babysitter_store_up 0` and withdraws every value read
from it (never a healthy zero), as before. `babysitter_store_read_age_seconds` says how old the
published values are; a snapshot older than STALE_INTERVALS intervals (the thread is stuck or
not running, as in an app built without the controller) is read again by the scrape that
finds it, one scrape at a time. While another read holds the slot past that age (a read that
hangs: a database host gone without a reset), a scrape sends `babysitter_store_up 0` and no
store value: old values are never published as current."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from sqlalchemy import or_, select

from babysitter.controller.api import cockpit_metrics
from babysitter.controller.api.api_read import node_view
from babysitter.controller.db import models
from babysitter.controller.db.store import Store, aware, now, stored_finding
from babysitter.controller.loop.record.metrics import ControllerMetrics

log = logging.getLogger(__name__)
STALE_INTERVALS = 3


@dataclass(frozen=True)
class Published:
    """One read of the store, rendered: what every scrape sends until the next read."""

    body: bytes  # Prometheus text of the store-derived families
    read_at: float  # time.time() of the read
    store_up: bool


class StoreMetrics:
    def __init__(
        self,
        store: Store,
        metrics: ControllerMetrics,
        runtime_state: dict[str, Any],
        interval_s: float = 5.0,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.state = runtime_state
        self.interval_s = interval_s
        self._published: Published | None = None
        self._reading = threading.Lock()  # one read at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # what a scrape sends while a read hangs: store_up 0 and the error count, no value
        withdrawn = CollectorRegistry()
        Gauge(
            "babysitter_store_up",
            "1 when the last read of the store-derived values could read the database; 0 when "
            "it could not or is overdue (then no store-derived value is published).",
            registry=withdrawn,
        ).set(0)
        withdrawn.register(metrics.store_errors)
        self._withdrawn = withdrawn

    def refresh(self) -> Published:
        """Read the store, set the gauges, render them and publish the result."""
        with self._reading:
            return self._refresh()

    def _refresh(self) -> Published:
        m = self.metrics
        try:
            verdicts: dict[str, int] = {"healthy": 0, "suspect": 0, "unhealthy": 0, "unknown": 0}
            # leaf switch of a node, where Slurm has a topology (the leader's snapshot)
            leaf_of = self.state.get("leaf_of") or (lambda name: None)
            per_switch: dict[tuple[str, str], int] = {}
            names, rows = self._read_nodes()
            of = {r["name"]: node_view(r, self.state)["verdict"] for r in rows}
            for name in names:
                v = of.get(name, "healthy")
                verdicts[v] = verdicts.get(v, 0) + 1
                leaf = leaf_of(name)
                if leaf:
                    per_switch[(leaf, v)] = per_switch.get((leaf, v), 0) + 1
            cockpit_metrics.refresh(self.store, m, self.state, now())
        except Exception:
            # a healthy zero ("0 unhealthy nodes") must never stand in for "cannot tell":
            # publish the failure and withdraw every count read from the store
            log.exception("/metrics: the database cannot be read")
            m.store_up.set(0)
            m.store_errors.inc()
            m.forget_store_values()
            up = False
        else:
            m.store_up.set(1)
            m.nodes.clear()  # verdicts that are gone leave no series
            for v, c in verdicts.items():
                m.nodes.labels(v).set(c)
            m.switch_nodes.clear()  # switches and verdicts that are gone leave no series
            for (leaf, v), c in per_switch.items():
                m.switch_nodes.labels(leaf, v).set(c)
            up = True
        published = Published(generate_latest(m.store_registry), time.time(), up)
        self._published = published
        return published

    def _read_nodes(self) -> tuple[list[str], list[dict[str, Any]]]:
        """Every node's name (one narrow column), and the rows of the nodes whose verdict may
        be other than healthy: a finding worse than ok, a verdict other than healthy, no
        report within the heartbeat timeout (the status page's filter, fleet_view.py). Every
        other node is healthy by the policy's own function: it is counted, not decoded."""
        n = models.nodes
        timeout = float(self.state.get("heartbeat_timeout_s", 120))
        may_not_be_healthy = or_(
            n.c.worst_severity != "ok",
            n.c.verdict != "healthy",
            n.c.last_report_at.is_(None),
            n.c.last_report_at < now() - timedelta(seconds=timeout),
        )
        cols = (n.c.name, n.c.open_findings, n.c.last_report_at, n.c.verdict)
        with self.store.engine.connect() as c:
            names = list(c.execute(select(n.c.name)).scalars())
            rows = [r._asdict() for r in c.execute(select(*cols).where(may_not_be_healthy))]
        for r in rows:
            r["last_report_at"] = aware(r["last_report_at"])
            r["open_findings"] = [stored_finding(f) for f in r["open_findings"] or []]
        return names, rows

    def current(self) -> Published:
        """The published snapshot; read first when there is none, or when it is stale and no
        other read is under way (while one is, store_up 0 and no store value, with the age;
        with none yet, after waiting for that read at most one interval)."""
        p = self._published
        if p is not None and time.time() - p.read_at < STALE_INTERVALS * self.interval_s:
            return p
        # none yet: wait for the first read at most one interval (it may hang: a scrape
        # waiting with it would hold a reader worker)
        if self._reading.acquire(timeout=self.interval_s if p is None else 0):
            try:
                return self._refresh()
            finally:
                self._reading.release()
        # another read holds the slot past STALE_INTERVALS: it hangs; its values are not current
        at = time.time() if p is None else p.read_at
        return Published(generate_latest(self._withdrawn), at, False)

    def exposition(self, leader: bool) -> bytes:
        """The whole of /metrics: the process's own series, then the published snapshot."""
        p = self.current()
        self.metrics.is_leader.set(1 if leader else 0)
        self.metrics.store_read_age.set(round(max(0.0, time.time() - p.read_at), 3))
        return generate_latest(self.metrics.registry) + p.body

    # ---- the thread that reads every interval_s
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="store-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.refresh()
            except Exception:  # never expected (refresh publishes its failures): keep going
                log.exception("store metrics: refresh failed")
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))
