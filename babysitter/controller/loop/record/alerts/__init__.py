"""Alerts: one `Alert` type, sinks (Alertmanager, Slack, PagerDuty, webhook) and a router that
dedups per (node, condition), resolves when the condition clears and groups storms."""

from babysitter.controller.loop.record.alerts.model import Alert
from babysitter.controller.loop.record.alerts.router import AlertRouter

__all__ = ["Alert", "AlertRouter"]
