"""Alert sinks. Each one renders an Alert for its service and posts it with httpx (timeout,
a couple of retries with tenacity); a failing sink never blocks the others. Sinks run on the
alert sender's thread (sender.py), never on the policy loop."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from babysitter.controller.loop.record.alerts.model import JOB, ONCALL, Alert
from babysitter.finding import Severity

log = logging.getLogger(__name__)


class _Retry(Exception):
    """A delivery worth retrying (network error, 5xx, 429)."""


class Sink:
    name = "sink"
    # Alertmanager-like receivers hold alert state with an expiry: they need firing alerts
    # re-sent (refresh) and want one alert per node (they group themselves)
    refresh = False
    groups = True
    # the alert routes (model.py) this sink takes: on-call's own sinks only on-call's alerts;
    # a sink that labels each alert with its route (Alertmanager, the webhook) takes both and
    # leaves the routing to its receiver
    routes: frozenset[str] = frozenset({ONCALL})

    def __init__(self, url: str, timeout_s: float = 5.0, retries: int = 2) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries

    def payload(self, alert: Alert) -> Any:
        raise NotImplementedError

    def _post(self, body: Any) -> str:
        try:
            r = httpx.post(self.url, json=body, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from None
        if r.status_code < 300:
            return "ok"
        err = f"HTTP {r.status_code}: {r.text[:200]}"
        if r.status_code >= 500 or r.status_code == 429:
            raise _Retry(err)
        return err  # a 4xx will not get better by retrying

    def send(self, alert: Alert) -> str:
        """'ok' or an error string (recorded with the alert)."""
        body = self.payload(alert)
        try:
            result = Retrying(
                stop=stop_after_attempt(self.retries + 1),
                wait=wait_exponential(multiplier=0.2, max=2.0),
                retry=retry_if_exception_type(_Retry),
                reraise=False,
            )(self._post, body)
        except RetryError as exc:
            result = str(exc.last_attempt.exception())
        if result != "ok":
            log.warning("alert sink %s failed: %s", self.name, result)
        return result


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AlertmanagerSink(Sink):
    """Alertmanager resolves an alert by itself once its endsAt passes (or resolve_timeout after
    the last post when no endsAt is given). Firing alerts therefore carry endsAt = now + 4 x the
    re-send interval and are re-sent every interval (Prometheus does the same), so a node that
    stays broken stays firing whatever resolve_timeout is."""

    name = "alertmanager"
    refresh = True
    groups = False
    routes = frozenset({ONCALL, JOB})

    def __init__(self, base_url: str, resend_s: float = 60.0, **kw: Any) -> None:
        super().__init__(base_url.rstrip("/") + "/api/v2/alerts", **kw)
        self.resend = timedelta(seconds=resend_s)

    def payload(self, alert: Alert) -> Any:
        labels = {
            "alertname": f"babysitter_{alert.condition}",
            "condition": alert.condition,
            "severity": alert.severity,
            "node": alert.node or "cluster",
            "service": "babysitter",
            # who it is for: the shipped Alertmanager example (deploy/alertmanager) sends
            # route="job" to the job receiver, never to the pager
            "route": alert.route,
        }
        if alert.job_id is not None:
            labels["job_id"] = alert.job_id
        if alert.owner:
            labels["owner"] = alert.owner  # the job's Slurm user: a receiver per user or team
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
        else:
            body["endsAt"] = _iso(datetime.now(UTC) + 4 * self.resend)
        return [body]


class SlackSink(Sink):
    name = "slack"

    def payload(self, alert: Alert) -> Any:
        return {"text": alert.text()}


class JobSlackSink(SlackSink):
    """The channel a site names for job alerts (alerts.job_slack_webhook_url)."""

    name = "slack_jobs"
    routes = frozenset({JOB})


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
                # PagerDuty knows critical, error, warning and info: ok is not an alert
                "severity": alert.severity
                if alert.severity is not Severity.OK
                else Severity.WARNING,
                "custom_details": {
                    "action_taken": alert.action_taken,
                    "what_to_do": alert.todo,
                    "nodes": alert.nodes,
                },
            }
        return body


class WebhookSink(Sink):
    name = "webhook"
    routes = frozenset({ONCALL, JOB})

    def payload(self, alert: Alert) -> Any:
        return {
            "route": alert.route,
            "job_id": alert.job_id,
            "owner": alert.owner,
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
