"""Prometheus metrics of the controller (names follow Prometheus conventions; checked with
`promtool check metrics` in the tests)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from babysitter.controller.db import audit
from babysitter.controller.db.actions import ActionKind
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.record.alerts.sinks import (
    AlertmanagerSink,
    PagerDutySink,
    SlackSink,
    WebhookSink,
)

# Known label values of the labelled counters, published at 0 from startup: a rule on
# increase() misses a series' first event, and a dashboard panel shows "no data" on a quiet
# fleet, when the series only appears with that event.
KNOWN_RESULTS = ("new", "duplicate")
KNOWN_DRAIN_OUTCOMES = ("done", "failed")
KNOWN_RESUME_OUTCOMES = ("done",)
KNOWN_REQUEUE_OUTCOMES = ("done", "failed")
KNOWN_ALERT_STATES = ("firing", "resolved", "failed")
# the items the loops isolate (the first word of RemediationEngine._isolated's item)
KNOWN_LOOP_ITEMS = (
    "action", "alerts", "audit", "batch", "decision", "fabric", "guard", "healer", "jobs",
    "maintenance", "perfs", "record", "sdc", "settle", "stragglers", "topology",
    "validation", "verdicts",
)  # fmt: skip
# babysitter_actions_total: the kinds the alert rules and the dashboard read, with every rule
KNOWN_ACTION_KINDS = (
    ActionKind.DRAIN,
    ActionKind.RESUME,
    ActionKind.REQUEUE,
    ActionKind.REQUEUE_JOBS,
    ActionKind.VALIDATE,
    ActionKind.REBOOT,
    ActionKind.RESET_GPU,
)
KNOWN_ACTION_RESULTS = (str(audit.AuditResult.DONE), str(audit.AuditResult.FAILED))


class ControllerMetrics:
    def __init__(self) -> None:
        # what the process counts as it goes (rendered on each scrape: a fixed number of
        # series, whatever the fleet's size) ...
        self.registry = CollectorRegistry()
        # ... and what is read from the store: read and rendered once per refresh
        # (controller/api/metrics_snapshot.py), never by a scrape
        self.store_registry = CollectorRegistry()
        # registered in this order, which is the order of /metrics
        self._ingest(self.registry)
        self._actions(self.registry)
        self._alerts(self.registry)
        self._loops(self.registry)
        self._read_from_store(self.store_registry)
        self.registry.register(AuditCollector())
        self._start_at_zero()

    def _start_at_zero(self) -> None:
        """Every known label value of the labelled counters exists at 0 (see KNOWN_*)."""
        for result in ("ok", "invalid"):
            self.config_reloads.labels(result)
        for result in KNOWN_RESULTS:
            self.reports.labels(result)
        for outcome in KNOWN_DRAIN_OUTCOMES:
            self.drains.labels(outcome)
        for outcome in KNOWN_RESUME_OUTCOMES:
            self.resumes.labels(outcome)
        for outcome in KNOWN_REQUEUE_OUTCOMES:
            self.requeues.labels(outcome)
        for sink in (AlertmanagerSink, SlackSink, PagerDutySink, WebhookSink):
            for state in KNOWN_ALERT_STATES:
                self.alerts.labels(sink.name, state)
        for item in KNOWN_LOOP_ITEMS:
            self.loop_errors.labels(item)

    def _ingest(self, r: CollectorRegistry) -> None:
        self.reports = Counter(
            "babysitter_reports_ingested_total",
            "Reports accepted by the API.",
            ["result"],
            registry=r,
        )
        # a report refused (4xx: the agent drops it) or not taken now (503: the agent spools it
        # and sends it again); 0 through a rolling upgrade (docs/deploy.md#skew)
        self.reports_refused = Counter(
            "babysitter_reports_refused_total",
            "Reports the API answered with an error, by HTTP status.",
            ["status"],
            registry=r,
        )
        self.ingest_latency = Histogram(
            "babysitter_ingest_latency_seconds",
            "Time from request to committed report.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )

    def _actions(self, r: CollectorRegistry) -> None:
        self.drains = Counter("babysitter_drains_total", "Drains decided.", ["outcome"], registry=r)
        self.resumes = Counter(
            "babysitter_resumes_total", "Resumes decided.", ["outcome"], registry=r
        )
        self.requeues = Counter(
            "babysitter_requeues_total", "Job requeues decided.", ["outcome"], registry=r
        )

    def _alerts(self, r: CollectorRegistry) -> None:
        self.alerts = Counter(
            "babysitter_alerts_total", "Alert notifications sent.", ["sink", "state"], registry=r
        )
        self.alerts_dropped = Counter(
            "babysitter_alerts_dropped_total",
            "Alert deliveries dropped because the sender's queue was full.",
            registry=r,
        )
        self.alert_record_errors = Counter(
            "babysitter_alert_record_errors_total",
            "Alert deliveries whose result could not be written to the database.",
            registry=r,
        )

    def _loops(self, r: CollectorRegistry) -> None:
        self.loop_errors = Counter(
            "babysitter_loop_item_errors_total",
            "Decisions, actions, jobs or alerts whose handling raised (recorded on the item).",
            ["item"],
            registry=r,
        )
        self.spool_replayed = Counter(
            "babysitter_agent_spool_replayed_reports_total",
            "Reports agents delivered late from their spool.",
            registry=r,
        )
        self.is_leader = Gauge(
            "babysitter_controller_leader", "1 when this controller acts on Slurm.", registry=r
        )
        # `systemctl reload` (SIGHUP): babysitter/reload.py
        self.config_reloads = Counter(
            "babysitter_config_reload_total",
            "Configuration reloads (SIGHUP), by result: ok, or invalid (the old one stays).",
            ["result"],
            registry=r,
        )
        self.config_last_reload_ok = Gauge(
            "babysitter_config_last_reload_success",
            "0 while the configuration file last read on reload was refused, else 1.",
            registry=r,
        )
        self.config_last_reload_ok.set(1)
        # the on-call cockpit (deploy/prometheus rules, deploy/grafana dashboard)
        self.tick_duration = Histogram(
            "babysitter_loop_tick_seconds",
            "Time one iteration of a controller loop (remediation, ...) took.",
            ["loop"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.fault_to_drain = Histogram(
            "babysitter_fault_to_drain_seconds",
            "From the first critical finding behind a drain (observed on the node) to the drain "
            "done in Slurm.",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 900),
            registry=r,
        )

    def _read_from_store(self, r: CollectorRegistry) -> None:
        """Read from the store every controller.metrics_interval_s, not per scrape
        (controller/api/cockpit_metrics.py, controller/api/metrics_snapshot.py)."""
        self._node_gauges(r)
        self._alert_and_store_gauges(r)

    def _node_gauges(self, r: CollectorRegistry) -> None:
        """The nodes' verdicts, drains and silence."""
        self.nodes = Gauge("babysitter_nodes", "Nodes by verdict.", ["verdict"], registry=r)
        self.guard_tripped = Gauge(
            "babysitter_guard_tripped", "1 while the blast-radius guard stops drains.", registry=r
        )
        self.oldest_drain_age = Gauge(
            "babysitter_oldest_drain_age_seconds",
            "Age of the oldest drain babysitter holds (0 when it holds none).",
            registry=r,
        )
        self.drained = Gauge("babysitter_nodes_drained", "Nodes drained by babysitter.", registry=r)
        self.node_drained = Gauge(
            "babysitter_node_drained_seconds",
            "How long each drained node has been drained, by who owns the drain (babysitter, "
            "admin: `babysitter drain`, other: drained in Slurm by someone else) and the "
            "state of its remediation (none, or the ledger's phase: rebooting, validating, ...).",
            ["node", "owner", "remediation"],
            registry=r,
        )
        self.silent = Gauge(
            "babysitter_nodes_silent",
            "Nodes that reported once and then not within controller.heartbeat_timeout_s.",
            registry=r,
        )

    def _alert_and_store_gauges(self, r: CollectorRegistry) -> None:
        """Firing alerts, maintenance, whether the store could be read, nodes by switch."""
        self.firing = Gauge(
            "babysitter_alerts_firing",
            "Alerts babysitter has firing, by condition (node_unhealthy, lemon_node, ...).",
            ["condition"],
            registry=r,
        )
        self.maintenance = Gauge(
            "babysitter_nodes_in_maintenance",
            "Nodes in an open maintenance window (not drained or paged by babysitter).",
            registry=r,
        )
        self.store_up = Gauge(
            "babysitter_store_up",
            "1 when the last read of the store-derived values could read the database; 0 when "
            "it could not (then no store-derived value is published: no node count reads as "
            "healthy).",
            registry=r,
        )
        self.store_errors = Counter(
            "babysitter_store_read_errors_total",
            "Reads of the store-derived values of /metrics that could not read the database.",
            registry=r,
        )
        self.store_read_age = Gauge(
            "babysitter_store_read_age_seconds",
            "Seconds since the store-derived values on /metrics were read (they are read every "
            "controller.metrics_interval_s, not per scrape).",
            registry=self.registry,  # set by each scrape
        )
        self.switch_nodes = Gauge(
            "babysitter_switch_nodes",
            "Nodes by leaf switch (Slurm topology, where there is one) and verdict.",
            ["switch", "verdict"],
            registry=r,
        )

    def forget_store_values(self) -> None:
        """The database cannot be read: withdraw every value read from it. Labelled series
        disappear; an unlabelled gauge becomes NaN (no value) rather than a stale or zero one."""
        self.nodes.clear()
        self.switch_nodes.clear()
        self.node_drained.clear()
        self.firing.clear()
        for g in (self.guard_tripped, self.oldest_drain_age, self.drained, self.silent):
            g.set(float("nan"))
        self.maintenance.set(float("nan"))


class AuditCollector(Collector):
    """babysitter_actions_total{kind,rule,result}: every audited action (controller/db/audit.py
    counts them as it writes them; `rule` is the policy rule or `manual`)."""

    def collect(self) -> Iterator[Metric]:
        c = CounterMetricFamily(
            "babysitter_actions",
            "Actions settled or requested, as written to the audit log.",
            labels=["kind", "rule", "result"],
        )
        counts = {
            (str(kind), str(rule), result): 0
            for kind in KNOWN_ACTION_KINDS
            for rule in Rule
            for result in KNOWN_ACTION_RESULTS
        }
        counts.update(audit.totals())
        for (kind, rule, result), n in sorted(counts.items()):
            c.add_metric([kind, rule, result], n)
        yield c
