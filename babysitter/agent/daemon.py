"""`babysitter agent`: runs checks on their intervals (each under its timeout, a hung one is not
restarted while hung), pushes event findings at once, reports every interval, and tells systemd
it is alive."""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any

from babysitter import __version__
from babysitter.agent import fabric_restart, reset, rma
from babysitter.agent.order_gate import OrderGate, Verdict
from babysitter.agent.shipper import Shipper
from babysitter.agent.spool import Spool
from babysitter.agent.sticky import StickyFindings, read_boot_id
from babysitter.checks import unparsed
from babysitter.checks.all import compose
from babysitter.checks.base import (
    TIER_STATS,
    Check,
    CheckContext,
    CheckResult,
    EventSource,
    execute,
    is_hung,
    mark_hung,
    timeout_result,
)
from babysitter.config import Config
from babysitter.errors import ConfigError
from babysitter.finding import Action, Finding, Severity
from babysitter.reload import AGENT_RESTART, AGENT_UNUSED, Outcome, reload, report_metric
from babysitter.report import Report, ReportKind
from babysitter.sdnotify import notify, watchdog_interval_s
from babysitter.secretfile import check_private

log = logging.getLogger(__name__)
# the finding an agent keeps while its config file is refused on reload (what the controller
# sees: the node turns suspect and alerts; see reload_config)
RELOAD_CHECK = "agent.config"


class Agent:
    def __init__(self, cfg: Config, config_path: str | Path | None = None) -> None:
        self.cfg = cfg
        # what SIGHUP re-reads (None: $BABYSITTER_CONFIG or the default, as at start)
        self.config_path = config_path
        self._reload_asked = False  # set by SIGHUP's handler (a plain flag: see ask_reload)
        self.last_reload: Outcome | None = None
        self._reloads = {"ok": 0, "invalid": 0}
        a = cfg.agent
        self.node = a.node_name
        try:
            check_private(a.token_file, "agent.token_file")  # like ssh with a key: refuse
            token = a.token_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"cannot read agent.token_file {a.token_file}: {exc.strerror}"
            ) from None
        self.spool = Spool(a.spool_path, a.spool_max_reports)
        self.shipper = Shipper(
            a.controller_url,
            token,
            self.spool,
            a.request_timeout_s,
            node=self.node,
            ca_file=a.ca_file,
            on_orders=self.take_orders,
        )
        self.ctx = CheckContext(cfg, self.node)
        composition = compose(self.ctx)
        self.checks: list[Check] = composition.checks
        self._sources = composition.sources  # started by start_sources() when supported
        self.sources: list[EventSource] = []
        self.latest: dict[str, list[Finding]] = {}
        # event findings (XIDs, NVML events) last until the node reboots, across agent restarts
        self.sticky = StickyFindings(
            Path(f"{a.spool_path}.events.json"), read_boot_id(a.boot_id_path)
        )
        self.durations: dict[str, float] = {}
        self._due: dict[str, float] = {}
        self._running: dict[str, float] = {}  # check name -> when its current run started
        self._timed_out: set[str] = set()
        self._go: dict[str, threading.Event] = {}  # wakes each check's worker thread
        self._lock = threading.Lock()
        # one full report at a time: its snapshot of `latest` and its sent_at are taken together
        # (see full_report)
        self._report_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a run ended past its check's due time
        # orders already taken (the controller repeats an order in every answer until it sees
        # the result), on disk beside the spool: a restarted agent never runs one again
        self.gate = OrderGate(Path(f"{a.spool_path}.orders.json"), self.node)
        self._resetting = threading.Lock()  # one GPU reset at a time
        # the last ordered reset's answer (kept across restarts until the next order)
        self.reset_outcome: dict[str, Any] | None = self.gate.answers.get(reset.METRIC)
        # the restart_fabric rung's orders (agent/fabric_restart.py)
        self.fabric = fabric_restart.Restarter(lambda: self.cfg, self._fabric_done)
        self.fabric.outcome = self.gate.answers.get(fabric_restart.METRIC)
        self.metrics = None
        if a.metrics_listen:
            from babysitter.agent.metrics import AgentMetrics

            self.metrics = AgentMetrics(a.metrics_listen)

    # ---- reports
    def _report(self, findings: list[Finding], kind: ReportKind) -> dict[str, Any]:
        """The report (babysitter.report.Report, the model the API validates) as it goes on
        the wire: the shipper and the spool keep it as JSON."""
        extra: dict[str, Any] = {}
        for c in self.checks:
            extra.update(c.metrics)
        metrics = {
            "check_duration_s": dict(self.durations),
            "tiers": TIER_STATS.snapshot(),
            "spool_size": self.spool.size(),
            "spool_dropped": self.spool.counter("dropped"),
            "spool_replayed_total": self.spool.counter("replayed"),
            "reports_refused": self.spool.counter("refused"),
            # a new one after a reboot: the controller's proof the node really came back
            "boot_id": self.sticky.boot_id,
            # versions, for a rolling upgrade (docs/deploy.md): any controller takes metrics
            "agent_version": __version__,
            "controller_wire": self.shipper.controller_wire,
            **extra,
        }
        if self._reloads["ok"] or self._reloads["invalid"]:
            metrics["config_reload"] = report_metric(self.last_reload, self._reloads)
        if self.reset_outcome is not None:
            metrics[reset.METRIC] = self.reset_outcome
        if self.fabric.outcome is not None:
            metrics[fabric_restart.METRIC] = self.fabric.outcome
        return Report.new(self.node, findings, metrics, kind).to_json_dict()

    def emit_event(self, findings: list[Finding]) -> None:
        """Event sources call this from their thread: ship at once; those with a reason to stay
        (hardware/sticky.py) are kept in later reports (until the node reboots, a reset, or
        NVML shows the condition gone)."""
        findings = self.sticky.add(findings)
        self.shipper.submit(self._report(findings, "event"))

    def full_report(self) -> dict[str, Any]:
        # The controller keeps the full report with the latest sent_at as the node's state.
        # Two check threads that finish together each send one: without this lock the one that
        # took its snapshot first (without the other's GPU-lost finding) could get the later
        # sent_at and hide the fault until the next report (seen: a drain 23 s late).
        with self._report_lock:
            with self._lock:
                findings = [f for fs in self.latest.values() for f in fs]
            findings += self.sticky.values()
            report = self._report(findings, "full")
        if self.metrics is not None:
            m = report["metrics"]
            self.metrics.update(findings, dict(self.durations), m["spool_size"], m["spool_dropped"])
            self.metrics.refused.set(m["reports_refused"])
            self.metrics.update_tiers(m["tiers"])
            self.metrics.update_unparsed(unparsed.REGISTRY.counts())
        return report

    # ---- checks
    def _store(self, check: Check, res: CheckResult) -> None:
        self._store_findings(check.name, res.findings, res.duration_s)

    def _store_findings(self, name: str, findings: list[Finding], duration_s: float | None) -> None:
        with self._lock:
            before = {f.key: f.severity for f in self.latest.get(name, [])}
            self.latest[name] = findings
            if duration_s is not None:  # a check's run (an event source has none)
                self.durations[name] = round(duration_s, 4)
        # A polled signal that just got worse (GPU lost, DBE, IB port down; a PCIe link trained
        # down) is reported now, not at the next report cycle: the node should stop taking jobs
        # at once, and a degradation should not wait another interval to be seen.
        # A critical signal that cleared (an IB port back up) is reported now as well: the
        # controller holds a babysat job's requeue on a link fault only until the grace ends,
        # and must know by then that the link is back.
        # (most findings are ok: the identity tests skip Severity's ordering for them)
        worse = any(
            (f.severity is Severity.WARNING or f.severity is Severity.CRITICAL)
            and f.severity > before.get(f.key, Severity.OK)
            for f in findings
        )
        critical = [key for key, sev in before.items() if sev is Severity.CRITICAL]
        after = {f.key: f.severity for f in findings} if critical else {}
        cleared = any(after.get(key, Severity.OK) < Severity.CRITICAL for key in critical)
        if worse or cleared:
            self.shipper.submit(self.full_report())

    def _worker(self, check: Check, go: threading.Event) -> None:
        """One long-lived thread per check (starting a thread per run costs more than most
        fast-tier runs); the main loop watches the clock (see _watch_timeouts)."""
        while not self._stop.is_set():
            go.wait()
            go.clear()
            if self._stop.is_set():
                return
            self._run_one(check)

    def _run_one(self, check: Check) -> None:
        try:
            started = time.time()
            res = execute(check)
            with self._lock:
                late = check.name in self._timed_out
            if not late:
                if not res.unknown:
                    self.sticky.clear_gone(check.name, res.findings, started)
                self._store(check, res)
                if check.ordered:
                    # the controller waits for this run (its hold keeps jobs off the node):
                    # tell it now, not at the next report
                    self.emit_event(check.take_events())
        finally:
            with self._lock:
                self._running.pop(check.name, None)
                self._timed_out.discard(check.name)
            mark_hung(check, False)
            if time.monotonic() >= self._due.get(check.name, 0.0):
                self._wake.set()  # overdue: the loop skipped it while it ran

    def _watch_timeouts(self) -> None:
        """A run past its timeout becomes a critical finding; the check is not started again
        while that run hangs (a hung driver call cannot be interrupted)."""
        now = time.monotonic()
        for c in self.checks:
            with self._lock:
                started = self._running.get(c.name)
                if started is None or c.name in self._timed_out:
                    continue
                timeout = c.effective_timeout()
                if now - started < timeout:
                    continue
                self._timed_out.add(c.name)
            mark_hung(c, True)
            self._store(c, timeout_result(c, timeout, now - started))

    def take_orders(self, orders: list[dict[str, Any]]) -> None:
        """Orders from the controller (in its answer to a report; the shipper's thread): run
        the named ordered check now. An order already taken is ignored (agent/order_gate.py);
        one for another node, or expired, is refused; one the agent cannot carry out is
        answered at once, so the controller releases the node."""
        for o in orders[:8]:
            oid, name = str(o.get("id", ""))[:64], str(o.get("check", ""))[:64]
            if not oid:
                continue
            verdict, why = self.gate.admit(o)
            if verdict is Verdict.TAKEN:
                continue
            if verdict is Verdict.REFUSED:
                log.warning("order %s (%s) refused: %s", oid, name, why)
                self._refuse_order(oid, name, why)
                continue
            if name == reset.ORDER:
                self._reset_gpu(o)
                continue
            if name == fabric_restart.ORDER:  # a service restart, on a thread of its own
                self.fabric.start(o)
                continue
            if name == rma.ORDER:  # RMA evidence, on a thread of its own (agent/rma.py)
                if not rma.start(self.cfg.agent, self.cfg.rma, o):
                    log.warning("order %s: RMA evidence already being collected", oid)
                continue
            check = next((c for c in self.checks if c.name == name and c.ordered), None)
            if check is None or is_hung(check) or check.name in self._running:
                why = (
                    f"{name} is not enabled on this agent"
                    if check is None
                    else f"{name} is still running or hung"
                )
                log.warning("order %s refused: %s", oid, why)
                self._refuse_order(oid, name, why)
                continue
            log.info("order %s: running %s", oid, name)
            check.order = oid
            self._start(check)

    def _reset_gpu(self, order: dict[str, Any]) -> None:
        """A GPU reset the controller ordered, on a thread of its own (the command may take a
        minute; the shipper's thread must not wait for it). One at a time."""
        if not self._resetting.acquire(blocking=False):
            busy = reset.ResetOutcome(
                str(order.get("id", ""))[:64], False, True, "GPU reset refused: one is running"
            )
            self._reset_done(busy)
            return

        def run() -> None:
            try:
                for c in self.checks:  # the kernel log read up to the reset's start
                    try:
                        c.before_gpu_reset()
                    except Exception:
                        log.exception("check %s: cannot read up to the reset", c.name)
                self._reset_done(reset.carry_out(self.cfg.agent, order))
            finally:
                self._resetting.release()

        threading.Thread(target=run, name="gpu-reset", daemon=True).start()

    def _reset_done(self, out: reset.ResetOutcome) -> None:
        """Report the outcome at once (a finding, and in the metrics of every report until the
        next order); after a reset, that GPU's event findings from before it are over, and the
        checks read the GPU again now."""
        with self._lock:
            self.reset_outcome = out.metric()
        self.gate.answer(reset.METRIC, self.reset_outcome)
        if out.ok and out.gpu is not None:
            self.sticky.clear_component(f"gpu{out.gpu}", out.started_at)
            for c in self.checks:  # the kernel log's XIDs of that GPU too (xid.kmsg)
                c.gpu_was_reset(out.gpu, out.started_at)
            self._due.clear()
            self._wake.set()
        self.shipper.submit(self._report([out.finding()], "event"))

    def _fabric_done(self, f: Finding) -> None:
        """A fabric service restart's outcome, reported at once; the checks read again now."""
        if self.fabric.outcome is not None:
            self.gate.answer(fabric_restart.METRIC, self.fabric.outcome)
        self._due.clear()
        self._wake.set()
        self.shipper.submit(self._report([f], "event"))

    def _refuse_order(self, oid: str, name: str, why: str) -> None:
        f = Finding(
            check=name or "order",
            component="host",
            severity=Severity.INFO,
            code="order.refused",
            message=f"order {oid} not carried out: {why}",
            details={"order": oid},
        )
        report = self._report([f], "event")
        report["metrics"]["order_refused"] = {"order": oid, "check": name, "why": why}
        self.shipper.submit(report)

    def _start(self, c: Check) -> None:
        """Hand a check to its worker thread (started on first use)."""
        with self._lock:
            self._running[c.name] = time.monotonic()
        go = self._go.get(c.name)
        if go is None:
            go = self._go[c.name] = threading.Event()
            threading.Thread(
                target=self._worker, args=(c, go), name=f"check:{c.name}", daemon=True
            ).start()
        go.set()

    def run_due_checks(self) -> None:
        now = time.monotonic()
        for c in self.checks:
            if c.ordered:
                continue  # only when the controller orders it (take_orders)
            if now < self._due.get(c.name, 0) or c.name in self._running or is_hung(c):
                continue
            # on a grid of the interval: checks with the same interval run in the same wake-up
            interval = c.effective_interval()
            self._due[c.name] = (math.floor(now / interval) + 1) * interval
            self._start(c)

    def next_wake(self) -> float:
        """Seconds until a check is due or a running one times out (the loop sleeps till then).
        A check still running at its due time is not waited for here: its run wakes the loop
        when it ends (see _run_one)."""
        now = time.monotonic()
        with self._lock:
            running = dict(self._running)
            timed_out = set(self._timed_out)
        times: list[float] = []
        for c in self.checks:
            due = self._due.get(c.name, now)
            if not c.ordered and (c.name not in running or due > now):
                times.append(due)
            if c.name in running and c.name not in timed_out:
                times.append(running[c.name] + c.effective_timeout())
        return max(0.01, min(times, default=now + 1.0) - now)

    def wait_first_results(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._watch_timeouts()
            with self._lock:
                if all(n in self._timed_out for n in self._running):
                    return
            time.sleep(0.02)

    # ---- configuration reload (SIGHUP, `systemctl reload babysitter-agent`)
    def ask_reload(self) -> None:
        """SIGHUP's handler only asks; the main loop reloads between two rounds. No lock is
        taken here: the handler runs on the main thread, which may hold `_wake`'s lock at that
        moment (a self-deadlock); a thread of its own wakes the loop."""
        self._reload_asked = True
        threading.Thread(target=self._wake.set, name="reload-wake", daemon=True).start()

    def reload_config(self) -> Outcome:
        """Re-read and validate the config file; apply what may change live (thresholds,
        intervals: babysitter/reload.py). Refused: the old configuration stays, the log and
        the metric say why, and so does a warning finding the controller alerts on (a node
        whose agent cannot take its config file is one to look at; the node turns suspect,
        no drain), until a reload succeeds."""
        out = reload(self.cfg, self.config_path, AGENT_RESTART, AGENT_UNUSED)
        self.last_reload = out
        self._reloads["ok" if out.ok else "invalid"] += 1
        if self.metrics is not None:
            self.metrics.config_last_reload_ok.set(1 if out.ok else 0)
            self.metrics.config_reloads.labels("ok" if out.ok else "invalid").inc()
        level = logging.ERROR if not out.ok else logging.WARNING
        log.log(level if not out.ok or out.needs_restart else logging.INFO, "%s", out.summary())
        if out.ok:
            for c in self.checks:
                c.reconfigured()
            self._due.clear()  # new intervals count from now
            self._store_findings(RELOAD_CHECK, [], None)
        else:
            bad = Finding(
                check=RELOAD_CHECK,
                component="host",
                severity=Severity.WARNING,
                code="config.reload_failed",
                message=out.summary()[:2000],
                action=Action.INSPECT,
            )
            self._store_findings(RELOAD_CHECK, [bad], None)
        return out

    # ---- main loop
    def start_sources(self) -> None:
        for src in self._sources:
            try:
                ok = src.supported()
            except Exception:
                ok = False
            if ok:
                src.on_health = self._source_health
                src.start(self.emit_event)
                self.sources.append(src)

    def _source_health(self, src: EventSource, findings: list[Finding]) -> None:
        """An event source started, or cannot start: its state is reported like a check's
        (replaced each time, never kept like an event), and at once when it got worse."""
        self._store_findings(src.name, findings, None)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        signal.signal(signal.SIGHUP, lambda *_: self.ask_reload())
        self.shipper.start()
        self.start_sources()
        self.run_due_checks()
        self.wait_first_results(max((c.effective_timeout() for c in self.checks), default=1))
        self.shipper.submit(self.full_report())
        notify("READY=1", f"STATUS=agent for {self.node}: {len(self.checks)} checks")
        wd = watchdog_interval_s()
        next_report = time.monotonic() + self.cfg.agent.interval_s
        last_wd = 0.0
        while not self._stop.is_set():
            if self._reload_asked:
                self._reload_asked = False
                self.reload_config()
            self._watch_timeouts()
            self.run_due_checks()
            now = time.monotonic()
            if now >= next_report:
                next_report = now + self.cfg.agent.interval_s
                self.shipper.submit(self.full_report())
            if wd and now - last_wd >= wd / 2:
                last_wd = now
                notify("WATCHDOG=1")
            # sleep until something is due: waking 5x a second for nothing costs CPU on every
            # node of the cluster
            wake = min(self.next_wake(), next_report - now, (wd / 2) if wd else 5.0)
            self._wake.wait(max(0.01, wake))
            self._wake.clear()
        notify("STOPPING=1")
        for go in self._go.values():
            go.set()  # workers see the stop and end
        for s in self.sources:
            s.stop()
        self.shipper.stop()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
