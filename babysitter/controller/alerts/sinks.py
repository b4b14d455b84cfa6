"""Alert sinks. Each one renders an Alert for its service and posts it with httpx (timeout,
a couple of retries); a failing sink never blocks the others."""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import UTC, datetime
from typing import Any

import httpx

from babysitter.controller.alerts.model import Alert

log = logging.getLogger(__name__)


class Sink:
    name = "sink"

    def __init__(self, url: str, timeout_s: float = 5.0, retries: int = 2) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries

    def payload(self, alert: Alert) -> Any:
        raise NotImplementedError

    def send(self, alert: Alert) -> str:
        """'ok' or an error string (recorded with the alert)."""
        body = self.payload(alert)
        err = ""
        for attempt in range(self.retries + 1):
            try:
                r = httpx.post(self.url, json=body, timeout=self.timeout_s)
                if r.status_code < 300:
                    return "ok"
                err = f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code < 500 and r.status_code != 429:
                    break
            except httpx.HTTPError as exc:
                err = f"{type(exc).__name__}: {exc}"
            if attempt < self.retries:
                time.sleep(0.2 * 2**attempt)
        log.warning("alert sink %s failed: %s", self.name, err)
        return err


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AlertmanagerSink(Sink):
    name = "alertmanager"

    def __init__(self, base_url: str, **kw: Any) -> None:
        super().__init__(base_url.rstrip("/") + "/api/v2/alerts", **kw)

    def payload(self, alert: Alert) -> Any:
        labels = {
            "alertname": f"babysitter_{alert.condition}",
            "condition": alert.condition,
            "severity": alert.severity,
            "node": alert.node or "cluster",
            "service": "babysitter",
        }
        body: dict[str, Any] = {
            "labels": labels,
            "annotations": {
                "summary": alert.summary,
                "description": alert.text(),
                "action_taken": alert.action_taken,
                "runbook": alert.todo,
            },
            "startsAt": _iso(alert.starts_at),
        }
        if alert.resolved:
            body["endsAt"] = _iso(alert.ends_at or datetime.now(UTC))
        return [body]


class SlackSink(Sink):
    name = "slack"

    def payload(self, alert: Alert) -> Any:
        return {"text": alert.text()}


class PagerDutySink(Sink):
    name = "pagerduty"

    def __init__(self, url: str, routing_key: str, **kw: Any) -> None:
        super().__init__(url, **kw)
        self.routing_key = routing_key

    def payload(self, alert: Alert) -> Any:
        dedup = hashlib.sha256(alert.key.encode()).hexdigest()[:32]
        body: dict[str, Any] = {
            "routing_key": self.routing_key,
            "dedup_key": dedup,
            "event_action": "resolve" if alert.resolved else "trigger",
        }
        if not alert.resolved:
            body["payload"] = {
                "summary": alert.title + ": " + alert.summary[:900],
                "source": alert.node or "babysitter",
                "severity": alert.severity
                if alert.severity in ("critical", "error", "warning", "info")
                else "warning",
                "custom_details": {
                    "action_taken": alert.action_taken,
                    "what_to_do": alert.todo,
                    "nodes": alert.nodes,
                },
            }
        return body


class WebhookSink(Sink):
    name = "webhook"

    def payload(self, alert: Alert) -> Any:
        return {
            "node": alert.node,
            "nodes": alert.nodes,
            "condition": alert.condition,
            "severity": alert.severity,
            "state": "resolved" if alert.resolved else "firing",
            "summary": alert.summary,
            "action_taken": alert.action_taken,
            "what_to_do": alert.todo,
            "starts_at": _iso(alert.starts_at),
            "details": alert.details,
        }
