"""Route alerts to sinks by severity, dedup per (node, condition), resolve when a condition
clears, and group storms: more than `group_threshold` new alerts of one condition in one
round become ONE alert that says how many nodes."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from babysitter.controller.alerts.model import Alert
from babysitter.controller.alerts.sinks import (
    AlertmanagerSink,
    PagerDutySink,
    Sink,
    SlackSink,
    WebhookSink,
)

SEV_RANK = {"info": 1, "warning": 2, "critical": 3}


class AlertState(Protocol):
    def upsert_alert(self, key: str, **values: Any) -> None: ...
    def alerts(self) -> list[dict[str, Any]]: ...


def sinks_from_config(cfg: Any) -> list[tuple[Sink, str]]:
    """(sink, minimum severity) per configured sink."""
    a = cfg.alerts
    t = a.timeout_s
    out: list[tuple[Sink, str]] = []
    if a.alertmanager_url:
        out.append((AlertmanagerSink(a.alertmanager_url, timeout_s=t), a.route_alertmanager))
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
    return out


class AlertRouter:
    def __init__(
        self,
        sinks: list[tuple[Sink, str]],
        state: AlertState,
        repeat_interval: timedelta = timedelta(hours=4),
        group_threshold: int = 3,
        on_sent: Any = None,
    ) -> None:
        self.sinks = sinks
        self.state = state
        self.repeat_interval = repeat_interval
        self.group_threshold = group_threshold
        self.on_sent = on_sent  # callback(sink_name, state) for metrics
        self.sent: list[Alert] = []  # what went out (for the demo and tests)

    def _deliver(self, alert: Alert) -> dict[str, str]:
        results = {}
        for sink, min_sev in self.sinks:
            if alert.resolved or SEV_RANK.get(alert.severity, 2) >= SEV_RANK.get(min_sev, 2):
                results[sink.name] = sink.send(alert)
                if self.on_sent:
                    self.on_sent(sink.name, "resolved" if alert.resolved else "firing")
        self.sent.append(alert)
        return results

    def process(
        self,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
        now: datetime | None = None,
    ) -> list[Alert]:
        """One round: `firing` alerts that hold now, `clearing` (node, condition) pairs that no
        longer hold. Returns what was sent."""
        now = now or datetime.now(UTC)
        out: list[Alert] = []
        fresh: list[Alert] = []
        known = {row["key"]: row for row in self.state.alerts()}  # one read per round
        for a in firing:
            prev = known.get(a.key)
            last = prev.get("last_sent_at") if prev else None
            if last is not None and last.tzinfo is None:
                last = last.replace(tzinfo=UTC)
            if prev and prev["state"] == "firing" and last and now - last < self.repeat_interval:
                continue
            fresh.append(a)
        by_cond: dict[str, list[Alert]] = defaultdict(list)
        for a in fresh:
            by_cond[a.condition].append(a)
        for cond, group in by_cond.items():
            if len(group) > self.group_threshold:
                nodes = sorted({a.node or "cluster" for a in group})
                sev = max(group, key=lambda a: SEV_RANK.get(a.severity, 2)).severity
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
                results = self._deliver(g)
                out.append(g)
                for a in group:  # remember each node's condition so it can resolve later
                    self._record(a, now, results)
            else:
                for a in group:
                    results = self._deliver(a)
                    out.append(a)
                    self._record(a, now, results)
        for node, cond in clearing:
            key = f"{node or 'cluster'}|{cond}"
            prev = known.get(key)
            if not prev or prev["state"] != "firing":
                continue
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
            results = self._deliver(r)
            out.append(r)
            self.state.upsert_alert(
                key, state="resolved", resolved_at=now, last_sent_at=now, sink_results=results
            )
        return out

    def _record(self, a: Alert, now: datetime, results: dict[str, str]) -> None:
        self.state.upsert_alert(
            a.key,
            node=a.node,
            condition=a.condition,
            severity=a.severity,
            state="firing",
            summary=a.text()[:2000],
            started_at=a.starts_at,
            last_sent_at=now,
            resolved_at=None,
            sink_results=results,
        )
