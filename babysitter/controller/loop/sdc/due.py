"""Which nodes the periodic SDC test is due on, and which of them may be tested now: pure. The
schedule's rows, Slurm's node listing and the agents' readiness in; the due nodes that may be
tested (longest untested first) and why each other due node may not, out. sdc_schedule.py
holds, orders and releases the nodes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from babysitter.slurm.client import SlurmNode
from babysitter.slurm.ownership import automatic_reason

FAILED = "sdc.failed"  # the code of a run that found corruption (checks/sdc/check.py)
# a node that was due but could not be tested (skipped, refused, no answer) is tried again
# after this long, or after interval_s when that is shorter
RETRY_S = 1800.0


@dataclass
class NodeSchedule:
    """One row of sdc_schedule."""

    node: str
    hold: str | None = None
    order_id: str | None = None
    ordered_at: datetime | None = None
    last_attempt_at: datetime | None = None
    last_run_at: datetime | None = None
    last_code: str | None = None
    last_library: str | None = None
    last_message: str | None = None
    last_gflops: dict[str, float] | None = None
    waiting: str | None = None

    @property
    def failed(self) -> bool:
        return self.last_code == FAILED

    def due_at(self, interval_s: float) -> datetime | None:
        """When the next test is due (None: never tested, due now). After a failure, sooner:
        the re-test is what can clear the node (or confirm the fault)."""
        times = []
        if self.last_run_at is not None:
            every = min(interval_s, RETRY_S) if self.failed else interval_s
            times.append(self.last_run_at + timedelta(seconds=every))
        if self.last_attempt_at is not None:
            times.append(self.last_attempt_at + timedelta(seconds=min(interval_s, RETRY_S)))
        return max(times) if times else None

    def row(self, now: datetime) -> dict[str, Any]:
        return {**self.__dict__, "updated_at": now}


def slurm_why_not(sn: SlurmNode | None, retest: bool = False, prefix: str = "") -> str:
    """Why Slurm's view of a node rules a test out now ("" when it is idle and free).
    retest: the node's last test failed; drained by babysitter (`prefix`) with no job left,
    it is tested again (that re-test is what clears it, or confirms the fault)."""
    if sn is None:
        return "not in Slurm's node list"
    drained_by_us = sn.flags <= {"DRAIN", "DRAINED"} and automatic_reason(sn.reason, prefix)
    if retest and prefix and sn.state == "IDLE" and drained_by_us:
        return ""
    if sn.state != "IDLE" or sn.flags:
        state = "+".join([sn.state, *sorted(sn.flags)])
        busy = " (jobs running)" if sn.state in ("ALLOCATED", "MIXED", "COMPLETING") else ""
        return f"Slurm shows it {state}{busy}: tested only while idle"
    return ""


def due_nodes(
    rows: Mapping[str, NodeSchedule],
    listing: Mapping[str, SlurmNode | None],
    held: set[str],
    agents: Mapping[str, str],
    interval_s: float,
    prefix: str,
    now: datetime,
) -> tuple[list[str], dict[str, str]]:
    """Due nodes that may be tested now (longest untested first), and why each other due
    node may not. `held`: nodes under test; `agents`: "" per node whose agent is ready, else
    why it is not (SdcScheduler._agents)."""
    due: list[tuple[datetime, str]] = []
    why: dict[str, str] = {}
    epoch = datetime.min.replace(tzinfo=UTC)
    for name, sn in listing.items():
        row = rows.get(name)
        at = row.due_at(interval_s) if row else None
        if (at is not None and at > now) or name in held:
            continue
        retest = row is not None and row.failed
        reason = slurm_why_not(sn, retest, prefix) or (
            "" if retest else agents.get(name, "no report from its agent yet")
        )
        if reason:
            why[name] = reason
        else:
            due.append((row.last_run_at or epoch if row else epoch, name))
    return [n for _, n in sorted(due)], why
