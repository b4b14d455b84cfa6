"""Route alerts to sinks by severity, dedup per (node, condition), resolve when a condition
clears, and group storms: more than `group_threshold` new alerts of one condition in one
round become ONE alert that says how many nodes (for sinks that do not group themselves).
Firing alerts are re-sent to refreshing sinks (Alertmanager) every `sink.resend`, so they do
not expire there. With a sender, delivery happens on its thread; without one, inline."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from babysitter.controller.loop.record.alerts.model import JOB, Alert
from babysitter.controller.loop.record.alerts.sender import AlertSender, Delivery
from babysitter.controller.loop.record.alerts.sinks import (
    AlertmanagerSink,
    JobSlackSink,
    PagerDutySink,
    Sink,
    SlackSink,
    WebhookSink,
)
from babysitter.finding import Severity

log = logging.getLogger(__name__)


class AlertState(Protocol):
    def upsert_alert(self, key: str, **values: Any) -> None: ...
    def upsert_alerts(self, rows: list[tuple[str, dict[str, Any]]]) -> None: ...
    def firing_alerts(self) -> list[dict[str, Any]]: ...


def sinks_from_config(cfg: Any) -> list[tuple[Sink, Severity]]:
    """(sink, minimum severity) per configured sink."""
    a = cfg.alerts
    t = a.timeout_s
    out: list[tuple[Sink, Severity]] = []
    if a.alertmanager_url:
        am = AlertmanagerSink(a.alertmanager_url, resend_s=a.alertmanager_resend_s, timeout_s=t)
        out.append((am, a.route_alertmanager))
    if a.slack_webhook_url:
        out.append((SlackSink(a.slack_webhook_url, timeout_s=t), a.route_slack))
    if a.pagerduty_routing_key:
        out.append(
            (
                PagerDutySink(a.pagerduty_url, a.pagerduty_routing_key, timeout_s=t),
                a.route_pagerduty,
            )
        )
    if a.webhook_url:
        out.append((WebhookSink(a.webhook_url, timeout_s=t), a.route_webhook))
    if a.job_slack_webhook_url:  # the channel for job alerts (never on-call's)
        out.append((JobSlackSink(a.job_slack_webhook_url, timeout_s=t), Severity.WARNING))
    return out


class AlertRouter:
    def __init__(
        self,
        sinks: list[tuple[Sink, Severity]],
        state: AlertState,
        repeat_interval: timedelta = timedelta(hours=4),
        group_threshold: int = 3,
        on_sent: Any = None,
        sender: AlertSender | None = None,
        on_record_error: Callable[[], None] | None = None,
    ) -> None:
        self.sinks = sinks
        self.state = state
        self.repeat_interval = repeat_interval
        self.group_threshold = group_threshold
        self.on_sent = on_sent  # callback(sink_name, state) for metrics
        # a delivery whose result could not be written: counted (metrics), logged, kept here
        self.on_record_error = on_record_error
        self.record_errors = 0
        self.last_record_error = ""
        self._rows: list[tuple[str, dict[str, Any]]] = []  # the round's records, written at its end
        self.sender = sender
        self.sent: list[Alert] = []  # what went out (for the demo and tests)
        self._refreshed: dict[str, datetime] = {}  # key -> last post to refreshing sinks
        self._outbox: list[Delivery] = []
        # job id -> its owner (the job's Slurm user), for job alerts: set by the job tracker
        # from the listing it reads (controller/loop/record/alerts/owners.py)
        self.owner_of: Callable[[str | None], str | None] | None = None

    def _owned(self, a: Alert) -> Alert:
        """A job alert with its owner; the resolved one too (Alertmanager matches an alert by
        its labels: a resolve without the owner label would not end the firing one)."""
        if a.route == JOB and a.owner is None and self.owner_of is not None:
            a.owner = self.owner_of(a.job_id)
        return a

    def _wanted(self, alert: Alert, sinks: list[Sink] | None = None) -> list[Sink]:
        return [
            sink
            for sink, min_sev in self.sinks
            if (sinks is None or sink in sinks)
            and alert.route in sink.routes  # a job's alert never reaches on-call's pager
            and (alert.resolved or alert.severity >= min_sev)
        ]

    def _deliver(
        self, alert: Alert, sinks: list[Sink] | None = None, record: bool = True
    ) -> dict[str, str]:
        targets = self._wanted(alert, sinks)
        self.sent.append(alert)
        if not targets:
            return {}
        if self.sender is None:
            results = {}
            for sink in targets:
                results[sink.name] = sink.send(alert)
                if self.on_sent:
                    self.on_sent(sink.name, "resolved" if alert.resolved else "firing")
            return results

        def done(results: dict[str, str]) -> None:
            if record:
                try:
                    self.state.upsert_alert(alert.key, sink_results=results)
                except Exception as exc:  # the delivery happened; its record did not
                    self.record_errors += 1
                    self.last_record_error = f"{alert.key}: {type(exc).__name__}: {exc}"[:500]
                    log.exception("could not record the delivery of alert %s", alert.key)
                    if self.on_record_error:
                        self.on_record_error()

        # submitted at the end of the round, after the alert's row is written
        self._outbox.append(Delivery(alert, targets, done))
        return {s.name: "queued" for s in targets}

    def _refresh_due(self, key: str, last: datetime | None, now: datetime) -> list[Sink]:
        since = self._refreshed.get(key, last)
        return [
            s
            for s, _ in self.sinks
            if s.refresh and (since is None or now - since >= getattr(s, "resend", timedelta(0)))
        ]

    def process(
        self,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
        now: datetime | None = None,
    ) -> list[Alert]:
        """One round: `firing` alerts that hold now, `clearing` (node, condition) pairs that no
        longer hold. Returns what was sent."""
        now = now or datetime.now(UTC)
        # one read per round; only firing rows matter (a resolved one neither refreshes nor
        # resolves again)
        known = {row["key"]: row for row in self.state.firing_alerts()}
        self._rows = []
        try:
            firing = [self._owned(a) for a in firing]
            fresh = [a for a in firing if not self._refresh(a, known.get(a.key), now)]
            by_cond: dict[str, list[Alert]] = defaultdict(list)
            for a in fresh:
                by_cond[a.condition].append(a)
            out: list[Alert] = []
            for cond, group in by_cond.items():
                if len(group) > self.group_threshold:
                    out.append(self._fire_storm(cond, group, now))
                else:
                    for a in group:
                        self._record(a, now, self._deliver(a))
                        out.append(a)
            for node, cond in clearing:
                resolved = self._resolve(node, cond, known, now)
                if resolved is not None:
                    out.append(resolved)
        finally:
            # the round's rows in one write (a rack's storm: one statement, not one per
            # node), before its deliveries are handed to the sender
            rows, self._rows = self._rows, []
            self.state.upsert_alerts(rows)
        outbox, self._outbox = self._outbox, []
        if self.sender is not None:
            for d in outbox:
                self.sender.submit(d)
        return out

    def _refresh(self, a: Alert, prev: dict[str, Any] | None, now: datetime) -> bool:
        """True when `a` was sent within the repeat interval and is still firing: it is not
        sent again, only re-posted to refreshing sinks whose resend time has come."""
        last = prev.get("last_sent_at") if prev else None
        if last is not None and last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        if not (prev and prev["state"] == "firing" and last and now - last < self.repeat_interval):
            return False
        due = self._refresh_due(a.key, last, now)
        if due:  # still firing: keep it alive where alerts expire
            started = prev.get("started_at") or a.starts_at
            if started.tzinfo is None:
                started = started.replace(tzinfo=UTC)
            a.starts_at = started
            self._deliver(a, due, record=False)
            self._refreshed[a.key] = now
        return True

    def _fire_storm(self, cond: str, group: list[Alert], now: datetime) -> Alert:
        """More than `group_threshold` new alerts of one condition: one alert naming the nodes
        for grouping sinks, each node's own alert for the others; every node's is recorded."""
        grouping = [s for s, _ in self.sinks if s.groups]
        single = [s for s, _ in self.sinks if not s.groups]
        nodes = sorted({a.node or "cluster" for a in group})
        sev = max(group, key=lambda a: a.severity.rank).severity
        g = Alert(
            None,
            cond,
            sev,
            f"{len(nodes)} nodes: {', '.join(nodes[:20])}"
            f"{' …' if len(nodes) > 20 else ''} — e.g. {group[0].summary}",
            group[0].action_taken,
            now,
            nodes=nodes,
            details={"count": len(nodes)},
        )
        results = self._deliver(g, grouping, record=False) if grouping else {}
        for a in group:  # remember each node's condition so it can resolve later
            mine = dict(results)
            if single:
                mine.update(self._deliver(a, single))
            self._record(a, now, mine)
        return g

    def _resolve(
        self, node: str | None, cond: str, known: dict[str, dict[str, Any]], now: datetime
    ) -> Alert | None:
        """The resolved alert of a firing (node, condition) that no longer holds; None when
        it was not firing."""
        key = f"{node or 'cluster'}|{cond}"
        prev = known.get(key)
        if not prev or prev["state"] != "firing":
            return None
        started = prev["started_at"]
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        r = Alert(
            node,
            cond,
            prev["severity"],
            f"{cond} cleared on {node or 'cluster'}",
            "condition cleared",
            started,
            resolved=True,
            ends_at=now,
        )
        results = self._deliver(self._owned(r))
        self._refreshed.pop(key, None)
        self._rows.append(
            (
                key,
                {
                    "state": "resolved",
                    "resolved_at": now,
                    "last_sent_at": now,
                    "sink_results": results,
                },
            )
        )
        return r

    def firing_keys(self) -> set[str]:
        return {row["key"] for row in self.state.firing_alerts()}

    def _record(self, a: Alert, now: datetime, results: dict[str, str]) -> None:
        self._refreshed[a.key] = now
        self._rows.append(
            (
                a.key,
                {
                    "node": a.node,
                    "condition": a.condition,
                    "severity": a.severity,
                    "state": "firing",
                    "summary": a.text()[:2000],
                    "started_at": a.starts_at,
                    "last_sent_at": now,
                    "resolved_at": None,
                    "sink_results": results,
                },
            )
        )
