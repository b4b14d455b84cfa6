"""Prometheus metrics of the controller (names follow Prometheus conventions; checked with
`promtool check metrics` in the tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reports = Counter(
            "babysitter_reports_ingested_total",
            "Reports accepted by the API.",
            ["result"],
            registry=r,
        )
        self.ingest_latency = Histogram(
            "babysitter_ingest_latency_seconds",
            "Time from request to committed report.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.nodes = Gauge("babysitter_nodes", "Nodes by verdict.", ["verdict"], registry=r)
        self.drains = Counter("babysitter_drains_total", "Drains decided.", ["outcome"], registry=r)
        self.resumes = Counter(
            "babysitter_resumes_total", "Resumes decided.", ["outcome"], registry=r
        )
        self.requeues = Counter(
            "babysitter_requeues_total", "Job requeues decided.", ["outcome"], registry=r
        )
        self.alerts = Counter(
            "babysitter_alerts_total", "Alert notifications sent.", ["sink", "state"], registry=r
        )
        self.alerts_dropped = Counter(
            "babysitter_alerts_dropped_total",
            "Alert deliveries dropped because the sender's queue was full.",
            registry=r,
        )
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
