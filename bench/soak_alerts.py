"""Alert volume in the soak (bench/soak.py): what on-call's pager, on-call's chat and the job
channel would have received, counted where the real alert router hands an alert to a sink.

The soak's controller runs at its defaults, where no sink is configured and the router sends
nothing. Here it gets the sinks a site with every route configured has: `sinks_from_config`
with a Slack webhook (on-call's chat), a PagerDuty key (on-call's pager), a job channel and a
generic webhook, each at its default lowest severity (Slack and the job channel warning,
PagerDuty critical, the webhook info). The sinks are the real classes, so the router's own
filters pick the targets: route (a job's alert never reaches on-call's sinks) and severity. Only
their `send` is replaced: it counts the alert instead of posting it. Delivery is inline (no
sender thread): the router decides the same, and the count does not depend on a thread.

What counts as one alert, per sink:
- fired: a firing alert for a key (node|condition) the sink had no firing alert for (a new
  condition, or the same one again after it resolved). A grouped storm alert (more than
  group_threshold new alerts of one condition in a round) is one alert for all its nodes.
- repeat: a firing alert for a key already firing at the sink: the router's re-send after its
  repeat interval (4 h at defaults) while the condition still holds.
- resolved: the router's resolve of a firing key.
Alertmanager is not among the sinks: it takes every route, labelled, re-posts firing alerts
every minute so they do not expire there, and leaves paging to its own routing (the shipped
deploy/alertmanager example); what it would page equals the pager's count here."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from babysitter.config import parse_config
from babysitter.controller.loop.record.alerts.model import JOB, ONCALL, Alert
from babysitter.controller.loop.record.alerts.router import AlertRouter, sinks_from_config
from babysitter.controller.loop.record.alerts.sinks import Sink
from babysitter.finding import Severity
from bench.poisson import poisson_interval  # the soak's own interval helper

# every non-refreshing sink configured (the URLs are never posted to)
COUNTED_SINKS = {
    "slack_webhook_url": "http://soak.invalid/oncall-slack",
    "pagerduty_routing_key": "soak-counted",
    "job_slack_webhook_url": "http://soak.invalid/job-slack",
    "webhook_url": "http://soak.invalid/webhook",
}
PAGER, ONCALL_CHAT, JOB_CHANNEL, EVERY_ROUTE = "pagerduty", "slack", "slack_jobs", "webhook"
KINDS = ("fired", "repeat", "resolved")
SEVERITIES = (Severity.CRITICAL, Severity.WARNING, Severity.INFO)


def condition_family(condition: str) -> str:
    """A condition without its job id, switch or XID number: job_log_1042 -> job_log_N."""
    return re.sub(r"\d+", "N", condition)


class AlertTally:
    """Counts every alert the router hands to each sink (see the module doc). Keys of `counts`:
    "sink|route|severity|kind"; of `conditions`: "route|severity|condition family" for the
    alerts fired to the every-route sink (the webhook)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.conditions: Counter[str] = Counter()
        self._firing: dict[str, set[str]] = {}  # sink -> keys firing there

    def install(self, router: AlertRouter) -> None:
        """The router (a controller's, at each start) sends to the counting sinks, inline."""
        cfg = parse_config({"alerts": dict(COUNTED_SINKS)})
        sinks = sinks_from_config(cfg)
        for sink, _ in sinks:
            sink.send = self._counter(sink)  # type: ignore[method-assign]
        router.sinks = sinks
        router.sender = None

    def _counter(self, sink: Sink) -> Any:
        firing = self._firing.setdefault(sink.name, set())

        def send(alert: Alert) -> str:
            keys = {f"{n}|{alert.condition}" for n in alert.nodes} or {alert.key}
            if alert.resolved:
                kind = "resolved"
                firing.difference_update(keys)
            else:
                kind = "repeat" if keys <= firing else "fired"
                firing.update(keys)
            self.counts[f"{sink.name}|{alert.route}|{alert.severity}|{kind}"] += 1
            if kind == "fired" and sink.name == EVERY_ROUTE:
                family = condition_family(alert.condition)
                self.conditions[f"{alert.route}|{alert.severity}|{family}"] += 1
            return "ok"

        return send


def count(counts: Counter[str], sink: str, route: str, severity: str, kind: str) -> int:
    return counts.get(f"{sink}|{route}|{severity}|{kind}", 0)


def route_table(counts: Counter[str]) -> dict[str, dict[str, dict[str, int]]]:
    """route -> severity -> kind -> alerts, from the every-route sink (the webhook: info up)."""
    return {
        route: {
            str(sev): {kind: count(counts, EVERY_ROUTE, route, sev, kind) for kind in KINDS}
            for sev in SEVERITIES
        }
        for route in (ONCALL, JOB)
    }


def sink_table(counts: Counter[str]) -> dict[str, dict[str, dict[str, int]]]:
    """sink -> route -> kind -> alerts (every severity): which routes each sink received."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for key, n in sorted(counts.items()):
        sink, route, _sev, kind = key.split("|")
        per = out.setdefault(sink, {}).setdefault(route, dict.fromkeys(KINDS, 0))
        per[kind] += n
    return out


def firing_at_end(rows: list[dict[str, Any]]) -> Counter[str]:
    """route|severity of the alerts still firing in the controller's store (its alert rows)."""
    out: Counter[str] = Counter()
    for r in rows:
        cond = str(r.get("condition") or r["key"].partition("|")[2])
        route = JOB if cond.startswith("job_log_") else ONCALL
        out[f"{route}|{r['severity']}"] += 1
    return out


def _rate(k: int, node_days: float) -> dict[str, Any]:
    """k alerts as a rate per 1,000 node-days with its two-sided 95 % interval (Garwood)."""
    kilo = node_days / 1000.0
    if kilo <= 0:
        return {"n": k, "per_1000_node_days": None, "ci95": [0.0, None]}
    lo, hi = poisson_interval(k, kilo)
    return {"n": k, "per_1000_node_days": k / kilo, "ci95": [lo, hi]}


def summary(
    counts: Counter[str],
    conditions: Counter[str],
    still_firing: Counter[str],
    node_days: float,
    nhc_drains: dict[str, int],
) -> dict[str, Any]:
    """The soak's alert figures: pages, on-call warnings, job alerts (fired, per 1,000
    node-days with 95 % intervals), every route by severity and kind, each sink's routes, the
    conditions that fired, what still fires at the end, and NHC's drains beside them."""
    job_fired = sum(count(counts, JOB_CHANNEL, JOB, str(s), "fired") for s in SEVERITIES)
    return {
        "definition": "fired: a firing alert for a node|condition not firing at that sink "
        "(a grouped storm alert counts once); repeat: the router's re-send of a still-firing "
        "one after its repeat interval; resolved: its resolve. Counted where the router hands "
        "the alert to each sink (bench/soak_alerts.py)",
        "pages": _rate(count(counts, PAGER, ONCALL, "critical", "fired"), node_days),
        "page_repeats": count(counts, PAGER, ONCALL, "critical", "repeat"),
        "oncall_warnings": _rate(count(counts, ONCALL_CHAT, ONCALL, "warning", "fired"), node_days),
        "oncall_warning_repeats": count(counts, ONCALL_CHAT, ONCALL, "warning", "repeat"),
        "job_alerts": _rate(job_fired, node_days),
        "job_alert_repeats": sum(
            count(counts, JOB_CHANNEL, JOB, str(s), "repeat") for s in SEVERITIES
        ),
        "by_route": route_table(counts),
        "by_sink": sink_table(counts),
        "fired_by_condition": dict(sorted(conditions.items(), key=lambda kv: (-kv[1], kv[0]))),
        "firing_at_end": dict(sorted(still_firing.items())),
        "nhc_drains": {iv: _rate(k, node_days) for iv, k in nhc_drains.items()},
    }


def _cell(x: dict[str, Any]) -> str:
    if x["per_1000_node_days"] is None:
        return f"{x['n']} (no node-days)"
    lo, hi = x["ci95"]
    return f"{x['n']}: {x['per_1000_node_days']:.3g} [{lo:.3g}, {hi:.3g}]"


def render(a: dict[str, Any]) -> list[str]:
    """The alert section of soak.md."""
    lines = [
        "Alerts each route would have received (counted from the real alert router's output "
        "to a pager, on-call's Slack, a job channel and a webhook, each at its default lowest "
        f"severity; {a['definition']}). Per 1,000 node-days, two-sided 95 % intervals:",
        "",
        "| what | route | fired: per 1,000 node-days [95 % CI] | repeats |",
        "|---|---|---|---|",
        f"| pages (critical, PagerDuty) | oncall | {_cell(a['pages'])} | {a['page_repeats']} |",
        f"| warnings to on-call (Slack) | oncall | {_cell(a['oncall_warnings'])} | "
        f"{a['oncall_warning_repeats']} |",
        f"| job alerts (job channel; never the pager) | job | {_cell(a['job_alerts'])} | "
        f"{a['job_alert_repeats']} |",
        *[
            f"| NHC every {iv} s: drains (NHC sends no alerts) | - | {_cell(x)} | - |"
            for iv, x in a["nhc_drains"].items()
        ],
        "",
    ]
    routes = a["by_route"]
    parts = [
        f"{route} {sev} {x['fired']}/{x['repeat']}/{x['resolved']}"
        for route, per in routes.items()
        for sev, x in per.items()
        if any(x.values())
    ]
    lines.append(
        "Every alert by route and severity (fired/repeat/resolved, the webhook's count): "
        + (", ".join(parts) or "none")
        + ". Each sink's routes: "
        + (
            "; ".join(
                f"{sink} " + ", ".join(f"{r} {sum(k.values())}" for r, k in per.items())
                for sink, per in a["by_sink"].items()
            )
            or "none"
        )
        + ". Fired by condition: "
        + (", ".join(f"{k} {v}" for k, v in a["fired_by_condition"].items()) or "none")
        + ". Still firing at the end: "
        + (", ".join(f"{k} {v}" for k, v in a["firing_at_end"].items()) or "none")
        + "."
    )
    return lines
