"""The runners of the job kinds of action: a drained node's `requeue_jobs` (queue a requeue
of each of its babysat jobs) and a job's `requeue` (from its checkpoint, within its limits, or
held for a link fault's grace)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Protocol

from babysitter.controller.db.actions import Action
from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import Settled
from babysitter.controller.loop.admit.gate import AdmittedSlurm
from babysitter.controller.loop.decide.link_hold import POLL_S
from babysitter.controller.loop.jobs.jobs import HELD_RULE, NCCL_RULE, REQUEUE_RULE, JobTracker
from babysitter.controller.loop.read.snapshot import SlurmSnapshot
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.slurm.client import SlurmClient


class ActionExecutor(Protocol):
    """What the runners use of the executor (act/executor.py)."""

    store: Store
    slurm: SlurmClient
    snapshot: SlurmSnapshot
    jobs: JobTracker
    metrics: ControllerMetrics
    bounded: Callable[..., Any]
    item_timeout_s: float
    job_listing: list[Any] | None
    closing: Settled | None

    def done(self, a: Action, status: str, outcome: str, now: datetime) -> str: ...


def requeue_jobs(ex: ActionExecutor, a: Action, now: datetime) -> str:
    assert a.node is not None
    ids = ex.jobs.babysat_on(a.node, ex.job_listing)
    # drained for a link fault: the node stays drained, its jobs' requeue waits for the
    # evidence (the grace is read now: a config reload applies to the next hold)
    grace = ex.jobs.cfg.policy.link_requeue_grace_s if a.rule == HELD_RULE else 0.0
    until = now + timedelta(seconds=grace) if grace else None
    queued = [i for i in ids if _queue(ex, i, a, until, now)]
    jobs = ", ".join(map(str, queued))
    if not queued:
        outcome = "no babysat job to requeue"
    elif until is not None:
        outcome = (
            f"held the requeue of babysat job(s) {jobs} until "
            f"{until.isoformat(timespec='seconds')}: a link fault, requeued only if still "
            f"down then ([policy] link_requeue_grace_s = {grace:g} s)"
        )
    else:
        outcome = f"queued requeue of babysat job(s) {jobs}"
    return ex.done(a, "done", outcome, now)


def _queue(
    ex: ActionExecutor, job_id: int, a: Action, until: datetime | None, now: datetime
) -> bool:
    """Queue the job's requeue (once: not while one is pending). A plain one is written with
    the run's outcomes (`ActionExecutor.closing`); a held one now, with its hold."""
    assert a.node is not None
    if until is not None or ex.closing is None:
        return (
            ex.jobs.record_requeue(job_id, [a.node], a.reason or "", hold_until=until, now=now)
            is not None
        )
    new = ex.jobs.requeue_action(job_id, [a.node], a.reason or "", now=now)
    if new is not None:
        ex.closing.follow_ups.append(new)
    return new is not None


def requeue(ex: ActionExecutor, a: Action, now: datetime) -> str:
    job_id = a.job_id
    assert job_id is not None
    bad = [n for n in (a.node or "").split(",") if n]
    if a.rule == HELD_RULE:  # held for a link fault's grace: requeue, release or wait
        down = {n for n, sn in ex.snapshot.nodes.items() if sn.down}
        status, outcome = ex.bounded(
            lambda: ex.jobs.execute_held(job_id, bad, a.reason or "", down, now),
            ex.item_timeout_s,
            key=f"job {job_id}",
        )
        if status == "pending":  # looked at again soon; not an attempt that failed
            ex.store.update_action(
                a.id, outcome=outcome[:1000], next_attempt_at=now + timedelta(seconds=POLL_S)
            )
            return "pending"
        return ex.done(a, status, outcome, now)
    if a.rule in (REQUEUE_RULE, NCCL_RULE):  # a babysat job: from its checkpoint, limits
        # its own NCCL's network failure may have killed it already (FAILED): requeued too
        died_ok = a.rule == NCCL_RULE
        status, outcome = ex.bounded(
            lambda: ex.jobs.execute_requeue(job_id, bad, a.reason or "", now, died_ok),
            ex.item_timeout_s,
            key=f"job {job_id}",
        )
        return ex.done(a, status, outcome, now)
    AdmittedSlurm(ex.slurm).requeue(job_id)  # the job's, never a node's: the door all the same
    ex.metrics.requeues.labels("done").inc()
    return ex.done(a, "done", "ok", now)
