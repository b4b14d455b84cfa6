"""`babysitter agent`: runs checks on their intervals (each under its timeout, a hung one is not
restarted while hung), pushes event findings at once, reports every interval, and tells systemd
it is alive."""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from babysitter.agent.shipper import Shipper
from babysitter.agent.spool import Spool
from babysitter.checks.all import select_checks
from babysitter.checks.base import (
    EVENT_SOURCES,
    Check,
    CheckContext,
    EventSource,
    is_hung,
    run_check,
)
from babysitter.config import Config
from babysitter.errors import ConfigError
from babysitter.finding import Finding, Severity
from babysitter.sdnotify import notify, watchdog_interval_s
from babysitter.secretfile import check_private

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
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
        )
        self.ctx = CheckContext(cfg, self.node)
        self.checks: list[Check] = select_checks(self.ctx)
        self.sources: list[EventSource] = []
        self.latest: dict[str, list[Finding]] = {}
        self.event_findings: dict[tuple[str, str, str], Finding] = {}
        self.durations: dict[str, float] = {}
        self._due: dict[str, float] = {}
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.metrics = None
        if a.metrics_listen:
            from babysitter.agent.metrics import AgentMetrics

            self.metrics = AgentMetrics(a.metrics_listen)

    # ---- reports
    def _report(self, findings: list[Finding], kind: str) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        for c in self.checks:
            extra.update(c.metrics)
        return {
            "node": self.node,
            "report_id": str(uuid.uuid4()),
            "sent_at": datetime.now(UTC).isoformat(),
            "kind": kind,
            "findings": [f.to_json_dict() for f in findings],
            "metrics": {
                "check_duration_s": dict(self.durations),
                "spool_size": self.spool.size(),
                "spool_dropped": self.spool.counter("dropped"),
                "spool_replayed_total": self.spool.counter("replayed"),
                "reports_refused": self.spool.counter("refused"),
                **extra,
            },
        }

    def emit_event(self, findings: list[Finding]) -> None:
        """Event sources call this from their thread: ship at once, keep them in later reports."""
        with self._lock:
            for f in findings:
                self.event_findings[f.key] = f
        self.shipper.submit(self._report(findings, "event"))

    def full_report(self) -> dict[str, Any]:
        with self._lock:
            findings = [f for fs in self.latest.values() for f in fs]
            findings += list(self.event_findings.values())
        report = self._report(findings, "full")
        if self.metrics is not None:
            m = report["metrics"]
            self.metrics.update(findings, dict(self.durations), m["spool_size"], m["spool_dropped"])
            self.metrics.refused.set(m["reports_refused"])
        return report

    # ---- checks
    def _run_one(self, check: Check) -> None:
        try:
            res = run_check(check)
            with self._lock:
                was_critical = {
                    f.key
                    for f in self.latest.get(check.name, [])
                    if f.severity is Severity.CRITICAL
                }
                self.latest[check.name] = res.findings
                self.durations[check.name] = round(res.duration_s, 4)
            # A polled check that just turned critical (GPU lost, DBE, IB port down) is reported
            # now, not at the next report cycle: the node should stop taking jobs at once.
            if any(
                f.severity is Severity.CRITICAL and f.key not in was_critical for f in res.findings
            ):
                self.shipper.submit(self.full_report())
        finally:
            with self._lock:
                self._running.discard(check.name)

    def run_due_checks(self) -> None:
        now = time.monotonic()
        for c in self.checks:
            if now < self._due.get(c.name, 0) or c.name in self._running or is_hung(c):
                continue
            self._due[c.name] = now + c.effective_interval()
            with self._lock:
                self._running.add(c.name)
            threading.Thread(
                target=self._run_one, args=(c,), name=f"check:{c.name}", daemon=True
            ).start()

    def wait_first_results(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._running:
                    return
            time.sleep(0.02)

    # ---- main loop
    def start_sources(self) -> None:
        for cls in EVENT_SOURCES.values():
            src = cls(self.ctx)
            try:
                ok = src.supported()
            except Exception:
                ok = False
            if ok:
                src.start(self.emit_event)
                self.sources.append(src)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        self.shipper.start()
        self.start_sources()
        self.run_due_checks()
        self.wait_first_results(max((c.effective_timeout() for c in self.checks), default=1))
        self.shipper.submit(self.full_report())
        notify("READY=1", f"STATUS=agent for {self.node}: {len(self.checks)} checks")
        wd = watchdog_interval_s()
        next_report = time.monotonic() + self.cfg.agent.interval_s
        while not self._stop.is_set():
            self.run_due_checks()
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + self.cfg.agent.interval_s
                self.shipper.submit(self.full_report())
            if wd:
                notify("WATCHDOG=1")
            self._stop.wait(min(0.2, wd or 0.2))
        notify("STOPPING=1")
        for s in self.sources:
            s.stop()
        self.shipper.stop()

    def stop(self) -> None:
        self._stop.set()
