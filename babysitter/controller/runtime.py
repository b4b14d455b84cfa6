"""Run the controller: migrations, the ingest writer, leader election, the background loops
(policy/remediation, retention) and the HTTP server."""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from sqlalchemy import text

from babysitter.config import Config
from babysitter.controller.api.api_rma import rma_router
from babysitter.controller.api.app import REPORTS_PATH, create_app
from babysitter.controller.api.auth import Authenticator, Principal
from babysitter.controller.api.budget import RequestBudget
from babysitter.controller.api.connguard import connection_cap, guarded_protocol, raise_fd_limit
from babysitter.controller.api.fastpath import IngestFastPath
from babysitter.controller.api.fleet_view import FleetView
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.api.ingress import Ingest
from babysitter.controller.api.metrics_snapshot import StoreMetrics
from babysitter.controller.api.orders import OrderBook
from babysitter.controller.api.readers import ReaderGate, reader_limits
from babysitter.controller.api.ui.routes import LOGIN_PATH
from babysitter.controller.db.store import Store
from babysitter.controller.loop.admit.maintenance import Maintenance
from babysitter.controller.loop.decide.wake import DrainWake
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.errors import ConfigError
from babysitter.reload import CONTROLLER_RESTART, CONTROLLER_UNUSED, Outcome, reload
from babysitter.sdnotify import notify, watchdog_interval_s
from babysitter.secretfile import check_private, read_secret

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)
Dependency = Callable[[Request], Principal]  # the API's reader / admin checks
LEADER_LOCK_KEY = 0x6261627973697474  # "babysitt"
# least time between two policy ticks when new faults wake the loop early: a fault storm
# (a rack going down report by report) batches into a few ticks instead of spinning
MIN_TICK_GAP_S = 0.1


class Leadership:
    """Only one controller acts on Slurm. Postgres: a session advisory lock held on a dedicated
    connection (lost with the connection, so a dead leader frees it). SQLite: always leader.
    Only controllers that remediate compete: an ingest-only replica (`remediation = false`)
    never takes the lock, so it can never hold leadership while nobody acts."""

    def __init__(self, store: Store, compete: bool = True) -> None:
        self.store = store
        self.compete = compete
        self.is_postgres = store.engine.dialect.name == "postgresql"
        self._conn: Any = None
        self.leader = compete and not self.is_postgres

    def refresh(self) -> bool:
        if not self.compete:
            return False
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
    def __init__(self, cfg: Config, config_path: str | Path | None = None) -> None:
        self.cfg = cfg
        # what SIGHUP re-reads (None: $BABYSITTER_CONFIG or the default, as at start)
        self.config_path = config_path
        self._reload_asked = False  # set by SIGHUP's handler (a plain flag: see ask_reload)
        self.last_reload: Outcome | None = None
        c = cfg.controller
        self._read_secrets()
        self.store = Store(c.database_url)
        # ingest wakes the policy loop when a node newly reports a drain-worthy finding
        self.wake = DrainWake()
        self.writer = ReportWriter(
            self.store, max_open_findings=c.max_open_findings_per_node, wake=self.wake
        )
        self.metrics = ControllerMetrics()
        # orders for agents (the SDC schedule's tests, the healer's GPU resets), carried in the
        # answers to their reports
        self.orders = (
            OrderBook.from_config(self.store, cfg)
            if cfg.checks.sdc.enabled or cfg.remediation.enabled
            else None
        )
        # one ingest service, shared by the report route and the fast path in front of it
        self.ingest = Ingest(
            self.writer, self.auth, self.metrics, c.max_body_bytes, orders=self.orders
        )
        self.state: dict[str, Any] = {
            "heartbeat_timeout_s": c.heartbeat_timeout_s,
            "history_lookback_days": c.history_lookback_days,
            "reason_prefix": cfg.slurm.reason_prefix,
            "leader": False,
            "remediation": c.remediation,
        }
        self.leadership = Leadership(self.store, compete=c.remediation)
        self.fleet = self._fleet_view()
        self.state["fleet_view"] = self.fleet
        # /metrics' store-derived values, read on a thread of their own (metrics_snapshot.py)
        self.store_metrics = StoreMetrics(
            self.store, self.metrics, self.state, c.metrics_interval_s
        )
        self.loops: list[tuple[str, Callable[[], object]]] = []
        self.engine: RemediationEngine | None = None
        self._stop = threading.Event()
        self.retention: Any = None
        # monotonic time the policy loop last finished an iteration: the systemd watchdog is
        # pinged only while this moves, so a stuck loop gets the service restarted
        self.last_progress = time.monotonic()

    def _read_secrets(self) -> None:
        """The cluster secret and the tokens; the TLS key must be private (refused at start)."""
        c = self.cfg.controller
        secret = read_secret(c.cluster_secret_file, "cluster secret")
        admin = read_secret(c.admin_token_file, "admin token").decode()
        self.auth = Authenticator(secret, admin, _token(c.read_token_file, "read token"))
        self.metrics_token = _token(c.metrics_token_file, "metrics token")  # None: /metrics open
        if bool(c.tls_cert_file) != bool(c.tls_key_file):
            raise ConfigError("controller.tls_cert_file and tls_key_file go together")
        if c.tls_key_file:
            check_private(c.tls_key_file, "controller.tls_key_file")

    def _fleet_view(self) -> FleetView:
        """The status page's snapshot of the fleet: rebuilt after each tick (at most once per
        page refresh period), read by every page request (controller/api/fleet_view.py)."""
        c = self.cfg.controller
        fleet = FleetView(
            self.store,
            self.state,
            lambda: self.engine.snapshot.nodes if self.engine is not None else {},
            lambda node: self._leaf_of(node) if self._topology_kind() != "block" else None,
            # NVLink domains: what agents report, else Slurm's topology/block (nvlink_domain.py)
            domain_of=lambda node: (
                self.engine.domains.membership.get(node) if self.engine is not None else None
            ),
            held=lambda: self.engine.snapshot.held if self.engine is not None else (),
            # a new listing is a new mapping, the topology is replaced when re-read; the domain
            # membership is rebuilt each tick (compared by value: a dict compare, in C)
            layout_token=lambda: (
                (
                    id(self.engine.snapshot.nodes),
                    id(self.engine.snapshot.topology),
                    self.engine.domains.membership,
                )
                if self.engine is not None
                else None
            ),
            min_gap_s=min(c.ui_refresh_s, 2 * c.loop_interval_s),
        )
        fleet.stale_after_s = max(60.0, 4 * c.loop_interval_s)
        return fleet

    def add_loop(self, name: str, fn: Callable[[], object]) -> None:
        self.loops.append((name, fn))

    def setup(self) -> None:
        self.store.upgrade()
        self.writer.start()
        # tokens of known nodes are recognised without the node header (older agents)
        self.auth.learn({n["name"] for n in self.store.node_rows()})
        if self.cfg.controller.remediation:
            self.engine = make_engine(self.cfg, self.store, self.metrics)
            self.state["leaf_of"] = self._leaf_of
            self.add_loop("remediation", self.engine.tick)
        # the first snapshot before the first request: the page never waits on a tick
        self.fleet.refresh()
        # its own thread: a prune never delays a policy tick
        from babysitter.controller.db.retention import Retention

        # the leader prunes; an ingest-only replica on SQLite prunes its own database
        self.retention = Retention(
            self.store,
            self.cfg.controller,
            lambda: (
                bool(self.state["leader"])
                or not (self.leadership.compete or self.leadership.is_postgres)
            ),
            rma=self.cfg.rma,
        )
        self.retention.start()

    def loop_forever(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            if self._reload_asked:  # between two ticks, never in the middle of one
                self._reload_asked = False
                self.reload_config()
            self.tick()
            self._wait_next_tick(started, self.cfg.controller.loop_interval_s)

    def ask_reload(self) -> None:
        """SIGHUP: reload before the next tick. The handler only asks and takes no lock (a
        second signal could interrupt it while it holds one); a thread wakes the loop."""
        self._reload_asked = True
        threading.Thread(target=self.wake.event.set, name="reload-wake", daemon=True).start()

    def reload_config(self) -> Outcome:
        """Re-read and validate the config file; apply what may change live (babysitter/
        reload.py). Refused: the old configuration stays, and the log, the metrics and the
        config_reload_failed alert say why."""
        out = reload(self.cfg, self.config_path, CONTROLLER_RESTART, CONTROLLER_UNUSED)
        self.last_reload = out
        self.metrics.config_last_reload_ok.set(1 if out.ok else 0)
        self.metrics.config_reloads.labels("ok" if out.ok else "invalid").inc()
        # error: refused; warning: some keys wait for a restart (both stay in the journal)
        level = logging.ERROR if not out.ok else logging.WARNING
        log.log(level if not out.ok or out.needs_restart else logging.INFO, "%s", out.summary())
        if out.ok:
            c = self.cfg.controller
            self.state["heartbeat_timeout_s"] = c.heartbeat_timeout_s
            self.state["history_lookback_days"] = c.history_lookback_days
            # the status page's rebuild gap and stale mark follow a live loop_interval_s
            self.fleet.min_gap_s = min(c.ui_refresh_s, 2 * c.loop_interval_s)
            self.fleet.stale_after_s = max(60.0, 4 * c.loop_interval_s)
        if self.engine is not None:
            self.engine.config_reloaded(out.error if not out.ok else None)
        return out

    def tick(self) -> bool:
        """One iteration of the loops. Only a tick whose every loop succeeded counts as
        progress: the systemd watchdog is fed on progress, so a loop that fails on every tick
        (database gone, no file descriptor left) gets the service restarted instead of
        looking alive."""
        self.state["leader"] = self.leadership.refresh()
        # an ingest-only replica on SQLite still prunes its own database
        owner = self.state["leader"] or not (self.leadership.compete or self.leadership.is_postgres)
        ok = True
        if owner:
            for name, fn in self.loops:
                if name != "retention" and not self.state["leader"]:
                    continue
                began = time.perf_counter()
                try:
                    fn()
                except Exception:
                    ok = False
                    log.exception("loop %s failed", name)
                self.metrics.tick_duration.labels(name).observe(time.perf_counter() - began)
        if self.fleet.due():
            # after the loops: the page shows what this tick decided; a failed read publishes
            # every node as unknown and never fails the tick
            began = time.perf_counter()
            self.fleet.refresh()
            self.metrics.tick_duration.labels("fleet_view").observe(time.perf_counter() - began)
        if ok:
            self.last_progress = time.monotonic()
            self.state["loop_progress_at"] = time.time()
        return ok

    def _wait_next_tick(self, started: float, interval: float) -> None:
        """Sleep until the next tick is due, or until ingest stores a new drain-worthy
        finding (then tick at once, but never sooner than MIN_TICK_GAP_S after the last;
        news from several nodes is first gathered into one tick, see loop/decide/wake.py)."""
        self._stop.wait(max(0.0, MIN_TICK_GAP_S - (time.monotonic() - started)))
        if self.wake.event.wait(max(0.0, interval - (time.monotonic() - started))):
            self.wake.gather(self._stop)
        self.wake.begin_tick()

    def close(self) -> None:
        """Finish the queued writes, then close the database."""
        self.writer.close()
        self.store.close()

    def watchdog_ok(self, watchdog_s: float) -> bool:
        """Ping systemd only while the policy loop finished an iteration within the watchdog
        period (plus one loop interval and the Slurm timeout a tick may legitimately wait)."""
        limit = 2 * watchdog_s + self.cfg.controller.loop_interval_s
        return time.monotonic() - self.last_progress <= limit

    def app(self) -> IngestFastPath:
        """The API (with the status page and the maintenance routes) behind the ingest fast
        path."""
        api = create_app(
            self.store,
            self.auth,
            self.metrics,
            self.ingest,
            self.state,
            extra=[
                self._ui_router,
                self._maintenance_router,
                rma_router(self.store, self.cfg, self.auth),
            ],
            store_metrics=self.store_metrics,
            metrics_token=self.metrics_token,
        )
        return IngestFastPath(api, self.ingest)

    def served_app(self) -> RequestBudget:
        """The ASGI app the server runs: app() behind the readers' rate limits and worker
        budget (readers.py) and the senders' budgets of requests in flight (budget.py)."""
        c = self.cfg.controller
        return RequestBudget(
            ReaderGate(self.app(), reader_limits(c), c.reader_workers, c.reader_queue),
            self.auth,
            REPORTS_PATH,
            LOGIN_PATH,
            per_node=c.node_requests_in_flight,
            login=c.login_requests_in_flight,
            per_client=c.client_requests_in_flight,
        )

    def _slurm_nodes(self) -> dict[str, Any]:
        return dict(self.engine.snapshot.nodes) if self.engine is not None else {}

    def _topology_kind(self) -> str:
        return self.engine.snapshot.topology.kind if self.engine is not None else ""

    def _leaf_of(self, node: str) -> str | None:
        """The node's leaf switch in Slurm's topology (None without one)."""
        return self.engine.snapshot.topology.leaf(node) if self.engine is not None else None

    def _ui_router(self, reader: Dependency, admin: Dependency) -> APIRouter:
        from babysitter.controller.api.ui.routes import ui_router
        from babysitter.controller.api.ui.session import Sessions
        from babysitter.controller.api.ui.throttle import LoginThrottle

        c = self.cfg.controller
        return ui_router(
            self.store,
            self.auth,
            Sessions(self.auth.secret, self.auth.admin_token, self.auth.read_token),
            self.state,
            self.fleet,
            c.ui_refresh_s,
            secure_cookie=secure_cookie(c.public_url),
            throttle=LoginThrottle(c.login_failures),
        )

    def _maintenance_router(self, reader: Dependency, admin: Dependency) -> APIRouter:
        from babysitter.controller.api.maintenance_api import maintenance_router

        return maintenance_router(self.maintenance(), reader, admin)

    def maintenance(self) -> Maintenance:
        """The maintenance windows service, with this controller's Slurm client (the
        engine's, or one of its own on a replica) and Alertmanager when configured."""
        from babysitter.controller.loop.admit.maintenance import Alertmanager
        from babysitter.slurm.factory import make_client

        if self.engine is not None:
            return self.engine.maintenance
        slurm = make_client(self.cfg)
        am_url = self.cfg.alerts.alertmanager_url
        return Maintenance(
            self.store,
            slurm,
            Alertmanager(am_url) if am_url else None,
            self.cfg.controller.maintenance_reservation_user,
        )

    def serve(self) -> None:
        host, _, port = self.cfg.controller.listen.rpartition(":")
        # `systemctl reload` (uvicorn handles SIGINT/SIGTERM only)
        signal.signal(signal.SIGHUP, lambda *_: self.ask_reload())
        self.setup()
        if self.orders is not None:
            self.orders.start()
        threading.Thread(target=self.loop_forever, name="policy-loop", daemon=True).start()
        self.store_metrics.start()
        server = self._server(host, int(port))
        self._notify_systemd(server)
        _tune_gc()
        _tune_switching()
        try:
            server.run()
        finally:
            self._shut_down()

    def _server(self, host: str, port: int) -> uvicorn.Server:
        import uvicorn

        c = self.cfg.controller
        # every HTTP connection is a descriptor: take what the hard limit allows, then keep
        # the connection cap below it, with room for the database, Slurm and alert sockets
        raise_fd_limit()
        cap = connection_cap(c.max_connections)
        return uvicorn.Server(
            uvicorn.Config(
                self.served_app(),
                host=host or "0.0.0.0",
                port=port,
                log_level="warning",
                access_log=False,
                http=guarded_protocol(c.header_timeout_s, cap, c.body_timeout_s),
                timeout_keep_alive=max(1, round(c.keep_alive_s)),
                # requests in flight: the guard bounds connections, this bounds tasks (503 past it)
                limit_concurrency=2 * cap,
                ssl_certfile=self.cfg.controller.tls_cert_file,
                ssl_keyfile=self.cfg.controller.tls_key_file,
            )
        )

    def _notify_systemd(self, server: uvicorn.Server) -> None:
        """READY=1 once the server listens; WATCHDOG=1 while it does and the loop moves."""
        wd = watchdog_interval_s()

        def watchdog() -> None:
            while not self._stop.is_set():
                if server.started and self.watchdog_ok(wd or 10):
                    notify("WATCHDOG=1")
                self._stop.wait(wd or 10)

        def ready() -> None:
            while not server.started and not self._stop.is_set():
                time.sleep(0.05)
            notify("READY=1", f"STATUS=listening on {self.cfg.controller.listen}")

        threading.Thread(target=ready, daemon=True).start()
        if wd:
            threading.Thread(target=watchdog, daemon=True).start()

    def _shut_down(self) -> None:
        self._stop.set()
        self.wake.event.set()  # the policy loop may be waiting on it
        self.store_metrics.stop()
        if self.engine is not None:
            self.engine.close()
        if self.orders is not None:
            self.orders.stop()
        if self.retention is not None:
            self.retention.stop()
        self.close()


def _token(path: Path | None, what: str) -> str | None:
    """An optional token file's token (None when the key is unset)."""
    return read_secret(path, what).decode() if path else None


def secure_cookie(public_url: str | None) -> bool:
    """The login cookie is Secure unless the deployment says browsers reach it over plain
    http: behind a TLS proxy the controller itself sees http, yet the cookie must never be
    sent in clear (docs/deploy.md)."""
    return not (public_url or "").lower().startswith("http://")


def _tune_gc() -> None:
    """Everything imported and built so far lives as long as the process: freeze it out of the
    cyclic collector, and collect the young generation less often. Each ingest request allocates
    a few hundred short-lived objects; with the defaults a full collection (which walks every
    FastAPI/SQLAlchemy/pydantic object) ran every few hundred requests, a latency spike each."""
    gc.collect()
    gc.freeze()
    _, g1, g2 = gc.get_threshold()
    gc.set_threshold(20_000, g1, g2)


# GIL hand-over period for the controller (CPython's default: 5 ms)
SWITCH_INTERVAL_S = 0.001


def _tune_switching() -> None:
    """The policy thread makes many short database and Slurm calls while the HTTP loop and the
    ingest writer keep the GIL busy: after each call it waits for a CPU-bound thread to hand
    the GIL over, up to the switch interval. At the default 5 ms a tick that drains a rack
    (a few hundred such calls) took seconds under 2,000 reports/s; the ingest writer waits the
    same way after each statement."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
