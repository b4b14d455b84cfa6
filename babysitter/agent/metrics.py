"""The agent's optional Prometheus endpoint (agent.metrics_listen): per-component health from
the latest findings, check durations, spool size and drops."""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from babysitter.finding import Finding

TIERS = ("fast", "slow")  # the polling tiers (checks/base.py TierStats)


def _unparsed_counter(r: CollectorRegistry) -> Counter:
    """Lines that named a fault in a wording no pattern knows (checks/unparsed.py)."""
    counter = Counter(
        "babysitter_unparsed_lines",
        "Log lines that named a fault (an XID, a bus loss, an NCCL failure) but matched no "
        "pattern, by source: a format babysitter has not learnt yet.",
        ["source"],
        registry=r,
    )
    for source in ("kmsg", "job_log"):
        counter.labels(source)  # at 0 from the start: increase() sees the first line
    return counter


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
        # per polling tier (fast / slow): what the checks cost, so the cost on a real GPU can be
        # estimated from rate(nvml calls) x the driver's cost per call
        self.tier_cpu = Counter(
            "babysitter_agent_tier_cpu_seconds",
            "CPU seconds spent in check runs, by polling tier.",
            ["tier"],
            registry=r,
        )
        self.tier_calls = Counter(
            "babysitter_agent_nvml_calls",
            "NVML calls made by check runs, by polling tier.",
            ["tier"],
            registry=r,
        )
        self.tier_runs = Counter(
            "babysitter_agent_check_runs", "Check runs, by polling tier.", ["tier"], registry=r
        )
        for counter in (self.tier_cpu, self.tier_calls, self.tier_runs):
            for tier in TIERS:
                counter.labels(tier)  # at 0 from the start: increase() sees the first run
        self.process_cpu = Gauge(
            "babysitter_agent_process_cpu_seconds",
            "CPU seconds of the whole agent process (every thread).",
            registry=r,
        )
        self.process_cpu.set_function(lambda: sum(os.times()[:2]))
        # `systemctl reload` (SIGHUP): babysitter/reload.py; the names the controller's have
        self.config_reloads = Counter(
            "babysitter_config_reload_total",
            "Configuration reloads (SIGHUP), by result: ok, or invalid (the old one stays).",
            ["result"],
            registry=r,
        )
        for result in ("ok", "invalid"):
            self.config_reloads.labels(result)
        self.config_last_reload_ok = Gauge(
            "babysitter_config_last_reload_success",
            "0 while the configuration file last read on reload was refused, else 1.",
            registry=r,
        )
        self.config_last_reload_ok.set(1)
        self.unparsed = _unparsed_counter(r)
        self._seen: dict[tuple[str, str], float] = {}
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

    def update_tiers(self, snap: dict[str, dict[str, Any]]) -> None:
        """Feed the cumulative per-tier totals (TierStats.snapshot) into the counters."""
        for kind, counter in (
            ("cpu_s", self.tier_cpu),
            ("nvml_calls", self.tier_calls),
            ("runs", self.tier_runs),
        ):
            for tier, total in snap.get(kind, {}).items():
                prev = self._seen.get((kind, tier), 0.0)
                if total > prev:
                    counter.labels(tier).inc(total - prev)
                    self._seen[(kind, tier)] = float(total)

    def update_unparsed(self, counts: dict[str, int]) -> None:
        """Feed the cumulative per-source totals (unparsed.REGISTRY.counts()) into the counter."""
        for source, total in counts.items():
            prev = self._seen.get(("unparsed", source), 0.0)
            if total > prev:
                self.unparsed.labels(source).inc(total - prev)
                self._seen[("unparsed", source)] = float(total)
