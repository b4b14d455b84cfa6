"""What the status page's fleet snapshot holds (fleet_view.py builds it once per loop tick):
the nodes that need a human, every other node by name, counts per verdict and per group, and
what a page shows beside them. `content()` is what a page shows: equal contents keep the
snapshot's version, so a conditional GET stays 304."""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from babysitter.controller.db import audit
from babysitter.controller.db.store import JobRow, now
from babysitter.controller.loop.admit import maintenance

VERDICTS = ("unhealthy", "suspect", "unknown", "validating", "healthy")
OWNERS = ("babysitter", "admin", "healthcheck", "none")
NO_PARTITION = "(no Slurm partition known)"


@dataclass(frozen=True)
class Place:
    partitions: tuple[str, ...]
    switch: str | None
    domain: str | None


@dataclass(frozen=True)
class NodeRow:
    """A node that needs a human (or any node, when healthy ones are asked for)."""

    name: str
    verdict: str
    drained: bool
    maintenance: bool
    problem: str  # the first open finding's message, cut at PROBLEM_CHARS
    problems: int  # open findings
    owner: str  # whose Slurm reason holds it: OWNERS
    reason: str
    slurm_state: str
    # not shown on the fleet page: a node reporting the same fault again changes nothing there
    last_report_at: datetime | None = field(compare=False)
    place: Place


@dataclass(frozen=True)
class FleetSnapshot:
    version: int  # moves only when what a page shows changed
    instance: str  # this process: versions of two controllers never compare equal
    changed_at: datetime  # when what a page shows last changed
    built_at: float  # time.monotonic() of the build (a page older than a few ticks says so)
    build_s: float
    error: str | None  # the store could not be read: every node is unknown
    total: int
    counts: Mapping[str, int]  # verdict -> nodes
    by_partition: Mapping[str, Mapping[str, int]]  # partition -> verdict -> nodes
    by_switch: Mapping[str, Mapping[str, int]]
    by_domain: Mapping[str, Mapping[str, int]]
    needs_human: tuple[NodeRow, ...]  # not healthy, or drained: worst first, then by name
    healthy: tuple[str, ...]  # the other nodes' names, sorted
    places: Mapping[str, Place]  # every node's place (filters on healthy nodes)
    guard: Mapping[str, Any]
    alerts: tuple[Mapping[str, Any], ...]  # firing, most severe first (MAX_ALERTS of them)
    alerts_total: int
    windows: tuple[maintenance.Window, ...]
    jobs: tuple[JobRow, ...]
    jobs_total: int
    recent: tuple[audit.AuditEntry, ...]

    def content(self) -> tuple[Any, ...]:
        """What a page shows: equal contents keep the version (a conditional GET stays 304)."""
        return (
            self.error,
            self.total,
            tuple(self.counts.items()),
            _nested(self.by_partition),
            _nested(self.by_switch),
            _nested(self.by_domain),
            self.needs_human,
            self.healthy,
            _shown(self.guard, GUARD_SHOWN),
            _incidents(self.guard),
            tuple(_shown(a, ALERT_SHOWN) for a in self.alerts),
            self.alerts_total,
            repr(self.windows),
            tuple(_shown(j, JOB_SHOWN) for j in self.jobs),
            self.jobs_total,
            tuple(e.id for e in self.recent),
        )


# the fields the page shows (rows also carry times that move on every write)
GUARD_SHOWN = ("state", "tripped", "since", "rule", "rule_description", "reason", "blocked")
ALERT_SHOWN = ("severity", "node", "condition", "summary", "started_at")
JOB_SHOWN = (
    *("job_id", "name", "user", "state", "nodes", "babysit"),
    *("restart_count", "requeues", "resume_point"),
)


def _shown(row: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    return repr([row.get(k) for k in keys])


def _incidents(guard: Mapping[str, Any]) -> str:
    return repr(
        [
            (i.get("switch"), i.get("opened_at"), i.get("nodes"), i.get("jobs"))
            for i in guard.get("switch_incidents") or []
        ]
    )


def _nested(d: Mapping[str, Mapping[str, int]]) -> tuple[Any, ...]:
    return tuple((k, tuple(v.items())) for k, v in d.items())


def empty_snapshot(error: str | None = None) -> FleetSnapshot:
    return FleetSnapshot(
        version=0,
        instance=secrets.token_hex(4),
        changed_at=now(),
        built_at=time.monotonic(),
        build_s=0.0,
        error=error,
        total=0,
        counts=dict.fromkeys(VERDICTS, 0),
        by_partition={},
        by_switch={},
        by_domain={},
        needs_human=(),
        healthy=(),
        places={},
        guard={"state": "unknown", "tripped": False, "blocked": [], "switch_incidents": []},
        alerts=(),
        alerts_total=0,
        windows=(),
        jobs=(),
        jobs_total=0,
        recent=(),
    )


def plain_row(snap: FleetSnapshot, name: str, verdict: str, problem: str) -> NodeRow:
    """A node the snapshot holds only by name: not drained, no finding, no Slurm reason."""
    return NodeRow(
        name=name,
        verdict=verdict,
        drained=False,
        maintenance=False,
        problem=problem,
        problems=0,
        owner="none",
        reason="",
        slurm_state="",
        last_report_at=None,
        place=snap.places.get(name) or Place((NO_PARTITION,), None, None),
    )
