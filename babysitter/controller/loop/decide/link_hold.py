"""Drain fast, requeue on evidence: the pure policy of a babysat job's requeue held while a
link fault may still heal by itself.

A node whose InfiniBand port went down (or whose link retrained) is drained at once, so no new
job lands there. The babysat job already running there is not requeued at once: NCCL's IB
transport rides out a short outage. Each work request is retried after the QP's local ACK
timeout, 4.096 us x 2^NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT times before the queue pair errors
and the job dies; NCCL's defaults are NCCL_IB_TIMEOUT=20 (4.3 s) and NCCL_IB_RETRY_CNT=7, about
30 s (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html, NCCL_IB_TIMEOUT and
NCCL_IB_RETRY_CNT; `NCCL_PARAM(IbTimeout, "IB_TIMEOUT", 20)` in NCCL's net_ib transport; older
NCCL releases used 18 or 14, a shorter budget). So the requeue waits [policy]
link_requeue_grace_s (default 30 s): a link back within it was a flap the job survived, and
the job is never touched; a link still down after it (or a job that failed by itself, or any
other fault on the node) is a fault the job dies of, and the job is requeued as for any fault.

Link class: `ib.port_down` (the port is not ACTIVE) and `ib.link_downed` (the link retrained:
the trace of a flap between two reads). Not link class: a flapping port (`ib.port_flapping`,
repeated flaps are the evidence), the error counters (integrity, overruns), missing HCAs, and
NVLink (a GPU fault that NCCL does not retry over the network).

Facts in, a decision out; controller/loop/jobs/jobs.py gathers the facts and the executor acts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from babysitter.finding import Finding, Severity, job_owned

LINK_CODES = frozenset({"ib.port_down", "ib.link_downed"})
DOWN_CODES = frozenset({"ib.port_down"})  # the link is down now (link_downed: it was)
POLL_S = 2.0  # a held requeue looks at its job and node this often
# after the grace, a node whose link is back but that was not resumed yet (clean reports,
# a validation job) keeps the hold at most this long; then the job is left running
RESUME_WAIT_S = 600.0
FAILED_STATES = frozenset({"FAILED", "NODE_FAIL"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED"})

JobPhase = Literal["running", "failed", "ended"]


def critical(findings: Iterable[Finding]) -> list[Finding]:
    """The node's own critical findings (a job's log line is the job's, not the node's)."""
    return [f for f in findings if f.severity >= Severity.CRITICAL and not job_owned(f)]


def is_link_fault(findings: Iterable[Finding]) -> bool:
    """The node's critical findings are all of the link class (and there is one)."""
    crit = critical(findings)
    return bool(crit) and all(f.code in LINK_CODES for f in crit)


def grace_for(findings: Iterable[Finding], grace_s: float) -> float:
    """How long the requeue of a drained node's babysat jobs is held: the grace for a link
    fault, 0 (at once) for anything else or when the grace is off."""
    return grace_s if grace_s > 0 and is_link_fault(findings) else 0.0


def job_phase(states: Iterable[str]) -> JobPhase:
    """Running (or finishing), failed by itself (what a dead link does to it), or ended
    otherwise (completed, cancelled, requeued by someone else: not ours to requeue)."""
    words = set(states)
    if words & RUNNING_STATES:
        return "running"
    return "failed" if words & FAILED_STATES else "ended"


@dataclass(frozen=True)
class HoldFacts:
    now: datetime
    until: datetime  # the end of the grace
    job: JobPhase
    job_state: str  # Slurm's word, for the reason
    drained: bool  # a node of the hold is still drained by babysitter
    link_down: bool | None  # a node's port is down now; None: unknown (no fresh report)
    other_fault: str = ""  # what else is wrong there ("" none): that is requeued at once


@dataclass(frozen=True)
class HoldDecision:
    kind: Literal["wait", "requeue", "release"]
    why: str


def decide_hold(f: HoldFacts) -> HoldDecision:
    """Wait, requeue (the link did not come back, the job died, another fault) or release
    (the job is left alone: it survived the flap, or it is not ours any more)."""
    if f.job == "ended":
        return HoldDecision("release", f"job is {f.job_state or 'gone'}: nothing to requeue")
    if f.job == "failed":
        return HoldDecision("requeue", f"job {f.job_state} during the link grace")
    if f.other_fault:
        return HoldDecision("requeue", f"not only the link: {f.other_fault}")
    if not f.drained:
        return HoldDecision(
            "release", "node resumed: the link came back within the grace, job left running"
        )
    if f.now < f.until:
        return HoldDecision("wait", f"link grace until {f.until.isoformat(timespec='seconds')}")
    if f.link_down is None:
        return HoldDecision("requeue", "grace over and no fresh report from the node")
    if f.link_down:
        return HoldDecision("requeue", "link still down after the grace")
    if f.now >= f.until + timedelta(seconds=RESUME_WAIT_S):
        return HoldDecision(
            "release",
            f"link back, node not resumed within {RESUME_WAIT_S:.0f} s: job left running",
        )
    return HoldDecision("wait", "link back within the grace: waiting for the node's resume")
