"""The agent's optional Prometheus endpoint (agent.metrics_listen): per-component health from
the latest findings, check durations, spool size and drops."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from babysitter.finding import Finding


class AgentMetrics:
    def __init__(self, listen: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.health = Gauge(
            "babysitter_agent_component_health",
            "Worst severity per check and component: 0 ok, 1 info, 2 warning, 3 critical.",
            ["check", "component"],
            registry=r,
        )
        self.duration = Gauge(
            "babysitter_agent_check_duration_seconds",
            "Duration of the last run of each check.",
            ["check"],
            registry=r,
        )
        self.spool = Gauge(
            "babysitter_agent_spool_reports", "Reports waiting in the local spool.", registry=r
        )
        self.dropped = Gauge(
            "babysitter_agent_spool_dropped_reports",
            "Reports dropped from the full spool since it was created.",
            registry=r,
        )
        self.refused = Gauge(
            "babysitter_agent_reports_refused",
            "Reports the controller refused with a 4xx (dropped, not retried) since the spool "
            "was created.",
            registry=r,
        )
        host, _, port = listen.rpartition(":")
        start_http_server(int(port), addr=host or "127.0.0.1", registry=r)

    def update(
        self, findings: list[Finding], durations: dict[str, float], spool_size: int, dropped: int
    ) -> None:
        worst: dict[tuple[str, str], int] = {}
        for f in findings:
            key = (f.check, f.component)
            worst[key] = max(worst.get(key, 0), f.severity.rank)
        self.health.clear()
        for (check, comp), rank in worst.items():
            self.health.labels(check, comp).set(rank)
        for check, d in durations.items():
            self.duration.labels(check).set(d)
        self.spool.set(spool_size)
        self.dropped.set(dropped)
