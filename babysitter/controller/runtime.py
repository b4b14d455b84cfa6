"""Run the controller: migrations, the ingest writer, leader election, the background loops
(policy/remediation, retention) and the HTTP server."""

from __future__ import annotations

import gc
import importlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from babysitter.config import Config
from babysitter.controller.api import create_app
from babysitter.controller.auth import Authenticator, read_secret
from babysitter.controller.fastpath import with_fast_ingest
from babysitter.controller.metrics import ControllerMetrics
from babysitter.controller.store import Store
from babysitter.sdnotify import notify, watchdog_interval_s

log = logging.getLogger(__name__)
LEADER_LOCK_KEY = 0x6261627973697474  # "babysitt"


class Leadership:
    """Only one controller acts on Slurm. Postgres: a session advisory lock held on a dedicated
    connection (lost with the connection, so a dead leader frees it). SQLite: always leader."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.is_postgres = store.engine.dialect.name == "postgresql"
        self._conn: Any = None
        self.leader = not self.is_postgres

    def refresh(self) -> bool:
        if not self.is_postgres:
            return True
        try:
            if self._conn is None:
                self._conn = self.store.engine.connect()
                got = self._conn.execute(
                    text("SELECT pg_try_advisory_lock(:k)"), {"k": LEADER_LOCK_KEY}
                ).scalar()
                self._conn.commit()
                if not got:
                    self._conn.close()
                    self._conn = None
                self.leader = bool(got)
            else:
                self._conn.execute(text("SELECT 1"))
                self._conn.commit()
        except Exception as exc:
            log.warning("leadership check failed: %s", exc)
            try:
                if self._conn is not None:
                    self._conn.invalidate()
            except Exception:
                pass
            self._conn = None
            self.leader = False
        return self.leader


class Controller:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        c = cfg.controller
        secret = read_secret(c.cluster_secret_file, "cluster secret")
        admin = read_secret(c.admin_token_file, "admin token").decode()
        read = read_secret(c.read_token_file, "read token").decode() if c.read_token_file else None
        self.auth = Authenticator(secret, admin, read)
        self.store = Store(c.database_url)
        self.metrics = ControllerMetrics()
        self.state: dict[str, Any] = {"heartbeat_timeout_s": c.heartbeat_timeout_s, "leader": False}
        self.leadership = Leadership(self.store)
        self.loops: list[tuple[str, Callable[[], None]]] = []
        self._stop = threading.Event()
        self.retention: Any = None

    def add_loop(self, name: str, fn: Callable[[], None]) -> None:
        self.loops.append((name, fn))

    def setup(self) -> None:
        self.store.upgrade()
        self.store.start()
        try:
            remediation = importlib.import_module("babysitter.controller.remediation")
        except ImportError:
            remediation = None
        if remediation is not None and self.cfg.controller.remediation:
            engine = remediation.make_engine(self.cfg, self.store, self.metrics)
            self.add_loop("remediation", engine.tick)
        # its own thread: a prune never delays a policy tick
        from babysitter.controller.retention import Retention

        self.retention = Retention(
            self.store, self.cfg.controller, lambda: bool(self.state["leader"])
        )
        self.retention.start()

    def loop_forever(self) -> None:
        interval = self.cfg.controller.loop_interval_s
        while not self._stop.is_set():
            started = time.monotonic()
            self.state["leader"] = self.leadership.refresh()
            if self.state["leader"]:
                for name, fn in self.loops:
                    try:
                        fn()
                    except Exception:
                        log.exception("loop %s failed", name)
            self._stop.wait(max(0.05, interval - (time.monotonic() - started)))

    def app(self) -> Any:
        return with_fast_ingest(create_app(self.store, self.auth, self.metrics, self.state))

    def serve(self) -> None:
        import uvicorn

        host, _, port = self.cfg.controller.listen.rpartition(":")
        self.setup()
        threading.Thread(target=self.loop_forever, name="policy-loop", daemon=True).start()
        server = uvicorn.Server(
            uvicorn.Config(
                self.app(),
                host=host or "0.0.0.0",
                port=int(port),
                log_level="warning",
                access_log=False,
            )
        )
        wd = watchdog_interval_s()

        def watchdog() -> None:
            while not self._stop.is_set():
                if server.started:
                    notify("WATCHDOG=1")
                self._stop.wait(wd or 10)

        def ready() -> None:
            while not server.started and not self._stop.is_set():
                time.sleep(0.05)
            notify("READY=1", f"STATUS=listening on {self.cfg.controller.listen}")

        threading.Thread(target=ready, daemon=True).start()
        if wd:
            threading.Thread(target=watchdog, daemon=True).start()
        _tune_gc()
        try:
            server.run()
        finally:
            self._stop.set()
            if self.retention is not None:
                self.retention.stop()
            self.store.close()


def _tune_gc() -> None:
    """Everything imported and built so far lives as long as the process: freeze it out of the
    cyclic collector, and collect the young generation less often. Each ingest request allocates
    a few hundred short-lived objects; with the defaults a full collection (which walks every
    FastAPI/SQLAlchemy/pydantic object) ran every few hundred requests, a latency spike each."""
    gc.collect()
    gc.freeze()
    _, g1, g2 = gc.get_threshold()
    gc.set_threshold(20_000, g1, g2)
