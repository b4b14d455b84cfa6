"""Executing recorded actions through Slurm: the tick's drains and resumes in one call per
group, then every pending action that is due (requeue_jobs, requeue, guard_reset, and the
drains/resumes that waited for Slurm), each in its own error boundary, with its outcome
recorded on the action and retried with backoff while Slurm is unavailable."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from babysitter.controller.db import audit
from babysitter.controller.db.store import Store, aware
from babysitter.controller.db.tickstore import Settled, settle
from babysitter.controller.loop.alerts import Alert
from babysitter.controller.loop.guard import GUARD_KEY
from babysitter.controller.loop.jobs import REQUEUE_RULE, JobTracker
from babysitter.controller.loop.metrics import ControllerMetrics
from babysitter.controller.loop.policy import MANUAL_MARK, Decision
from babysitter.controller.loop.snapshot import SlurmSnapshot
from babysitter.finding import Severity
from babysitter.slurm.client import (
    SlurmClient,
    SlurmError,
    SlurmNotFound,
    SlurmNotOwned,
    SlurmUnavailable,
)

log = logging.getLogger(__name__)


def node_alert(
    d: Decision,
    outcome: str,
    firing: list[Alert],
    clearing: list[tuple[str | None, str]],
    now: datetime,
) -> None:
    """The alert of a drain/resume decision, saying what became of it in Slurm."""
    if d.kind == "drain":
        done = (
            "dry-run: would drain"
            if d.dry_run
            else (
                f"drained {d.node} in Slurm"
                if outcome == "done"
                else f"drain {outcome} (will retry)"
                if outcome == "pending"
                else f"drain {outcome}"
            )
        )
        firing.append(Alert(d.node, "node_unhealthy", Severity.CRITICAL, d.reason, done, now))
    else:
        clearing.append((d.node, "node_unhealthy"))


def first_critical(evidence: list[dict[str, Any]]) -> datetime | None:
    """When the earliest critical finding of an audit entry's evidence was observed."""
    times = []
    for f in evidence:
        if f.get("severity") != Severity.CRITICAL:
            continue
        try:
            times.append(aware(datetime.fromisoformat(str(f.get("observed_at")))))
        except ValueError:
            continue
    return min((t for t in times if t is not None), default=None)


class ActionExecutor:
    def __init__(
        self,
        store: Store,
        slurm: SlurmClient,
        snapshot: SlurmSnapshot,
        jobs: JobTracker,
        metrics: ControllerMetrics,
        bounded: Callable[..., Any],
        isolated: Callable[..., Any],
        item_timeout_s: float,
    ) -> None:
        self.store = store
        self.slurm = slurm
        self.snapshot = snapshot  # its `ok` and `stale` are set here; our moves applied to it
        self.jobs = jobs
        self.metrics = metrics
        self.bounded = bounded  # runs one job's work with a time limit
        self.isolated = isolated  # the engine's per-item error boundary
        self.item_timeout_s = item_timeout_s
        self.batch: list[tuple[dict[str, Any], Decision]] = []  # this tick's real drains/resumes
        self._job_listing: list[Any] | None = None  # shared by this tick's requeue_jobs actions

    def execute_batch(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        """The tick's drains and resumes: one Slurm call per (kind, reason) group, each of
        which re-checks ownership of exactly its nodes first (a rack of 32 nodes failing
        alike is one lookup and one `scontrol update NodeName=a,b,...`)."""
        batch, self.batch = self.batch, []
        groups: dict[tuple[str, str], list[tuple[dict[str, Any], Decision]]] = {}
        for a, d in batch:
            key = (d.kind, d.reason if d.kind == "drain" else "")
            groups.setdefault(key, []).append((a, d))
        if batch:
            self.snapshot.stale = True
        results: list[tuple[dict[str, Any], Decision, SlurmError | None]] = []
        for (kind, reason), items in groups.items():
            nodes = [str(d.node) for _, d in items]
            try:
                res = (
                    self.slurm.drain_many(nodes, reason)
                    if kind == "drain"
                    else self.slurm.resume_many(nodes)
                )
            except SlurmError as exc:  # e.g. a reason Slurm cannot take: the whole group
                res = {n: exc for n in nodes}
            for a, d in items:
                err = res.get(str(d.node), SlurmError(f"{kind} {d.node}: no answer for it"))
                results.append((a, d, err))
        # every outcome in one transaction; item by item if that fails
        outcomes = self.isolated("settle", lambda: self._settle_many(results, now)) or {}
        settled = []
        for a, d, err in results:
            outcome = outcomes.get(a["id"]) or self.isolated(
                f"action {a['kind']} {d.node}", partial(self._settle, a, err, now)
            )
            node_alert(d, outcome or "failed", firing, clearing, now)
            if outcome != "pending":
                settled.append(a["id"])
        self.isolated("audit", lambda: self._audit(settled, now))

    def _settle_many(
        self, results: list[tuple[dict[str, Any], Decision, SlurmError | None]], now: datetime
    ) -> dict[int, str]:
        """Record the outcomes of a batch of drains/resumes in one transaction (those waiting
        for Slurm are rescheduled one by one); returns action id -> status."""
        out: dict[int, str] = {}
        s = Settled()
        for a, _, err in results:
            aid, kind, node, reason = a["id"], a["kind"], a["node"], a.get("reason") or ""
            if isinstance(err, SlurmUnavailable):
                continue  # _settle reschedules it
            if isinstance(err, SlurmNotOwned):
                s.actions.append((aid, "skipped", str(err)))
                out[aid] = "skipped"
            elif err is not None:
                s.actions.append((aid, "failed", str(err)))
                out[aid] = "failed"
            elif kind == "drain":
                s.drained.append((node, reason))
                # the drain's follow-up is an action of its own, retried like any other
                s.follow_ups.append(
                    {
                        "kind": "requeue_jobs",
                        "node": node,
                        "reason": reason,
                        "rule": REQUEUE_RULE,
                        "requested_by": "policy",
                        "dry_run": False,
                    }
                )
                s.actions.append((aid, "done", "ok"))
                out[aid] = "done"
            else:
                s.resumed.append(node)
                s.actions.append((aid, "done", "ok"))
                out[aid] = "done"
        settle(self.store, s, now)
        self.snapshot.moved_here(s.drained, s.resumed)
        for a, _, _ in results:
            status = out.get(a["id"])
            if a["kind"] == "drain" and status in ("done", "failed"):
                self.metrics.drains.labels(status).inc()
            elif a["kind"] == "resume" and status == "done":
                self.metrics.resumes.labels("done").inc()
        return out

    def _settle(self, a: dict[str, Any], err: SlurmError | None, now: datetime) -> str:
        """Record the outcome of a batched drain/resume of one node; returns its status."""
        aid, kind, node, reason = a["id"], a["kind"], a["node"], a.get("reason") or ""
        if isinstance(err, SlurmUnavailable):
            self.snapshot.ok = False
            return self._retry_later(a, now, f"waiting: {err}")
        if isinstance(err, SlurmNotOwned):
            self.store.update_action(aid, status="skipped", done_at=now, outcome=str(err))
            return "skipped"
        if err is not None:
            self.store.update_action(
                aid, status="failed", done_at=now, attempts=1, outcome=str(err)[:1000]
            )
            if kind == "drain":
                self.metrics.drains.labels("failed").inc()
            return "failed"
        if kind == "drain":
            self.store.set_node(node, babysitter_drained=True, drain_reason=reason, drained_at=now)
            self.metrics.drains.labels("done").inc()
            # the drain's follow-up is an action of its own, retried like any other
            self.store.record_action(
                "requeue_jobs", node=node, reason=reason, rule=REQUEUE_RULE, requested_by="policy"
            )
        else:
            self.store.set_node(
                node, babysitter_drained=False, drain_reason=None, consecutive_clean=0
            )
            self.metrics.resumes.labels("done").inc()
        self.store.update_action(aid, status="done", done_at=now, attempts=1, outcome="ok")
        return "done"

    def run_pending(self, pending: list[dict[str, Any]], now: datetime) -> None:
        due = [a for a in pending if not ((nxt := aware(a["next_attempt_at"])) and nxt > now)]
        # every node drained in one tick: one job listing for all of their requeue_jobs
        nodes = [a["node"] for a in due if a["kind"] == "requeue_jobs" and a["node"]]
        self._job_listing = None
        if nodes and self.snapshot.ok:
            try:
                self._job_listing = self.slurm.jobs_on(nodes)
            except SlurmError:
                pass  # each action asks (and retries) on its own
        try:
            for a in due:
                self.execute(a, now)
        finally:
            self._job_listing = None

    def _retry_later(self, a: dict[str, Any], now: datetime, why: str) -> str:
        attempts = int(a.get("attempts") or 0)
        delay = min(30.0, 0.5 * 2**attempts)
        self.store.update_action(
            a["id"],
            attempts=attempts + 1,
            outcome=why[:1000],
            next_attempt_at=now + timedelta(seconds=delay),
        )
        return "pending"

    def execute(self, a: dict[str, Any], now: datetime) -> str:
        """Run one action in its own error boundary and audit it once it has settled;
        returns its new status."""
        status = self._execute_guarded(a, now)
        if status != "pending":
            self.isolated("audit", lambda: self._audit([a["id"]], now))
        return status

    def _audit(self, action_ids: list[int], now: datetime) -> None:
        """Audit settled actions; a drain done on the policy's own evidence also measures
        fault -> drain: from the first critical finding behind it to now (the drain has
        just been done in Slurm)."""
        done_at = datetime.now(UTC)
        for e in audit.record_actions(self.store, action_ids, now):
            if e.kind != "drain" or e.result is not audit.AuditResult.DONE or e.actor != "policy":
                continue
            first = first_critical(e.evidence)
            if first is not None:
                self.metrics.fault_to_drain.observe(max(0.0, (done_at - first).total_seconds()))

    def _execute_guarded(self, a: dict[str, Any], now: datetime) -> str:
        try:
            return self._execute_one(a, now)
        except Exception as exc:  # a bug or a hostile input: recorded on this action only
            log.exception("action %s (%s) failed", a["id"], a["kind"])
            self.metrics.loop_errors.labels("action").inc()
            try:
                self.store.update_action(
                    a["id"],
                    status="failed",
                    done_at=now,
                    attempts=int(a.get("attempts") or 0) + 1,
                    outcome=f"error: {type(exc).__name__}: {str(exc)[:500]}",
                )
            except Exception:
                log.exception("cannot record the failure of action %s", a["id"])
            return "failed"

    def _execute_one(self, a: dict[str, Any], now: datetime) -> str:
        aid, kind, node, job_id = a["id"], a["kind"], a["node"], a["job_id"]
        reason = a.get("reason") or ""
        dry_run = bool(a.get("dry_run"))
        attempts = int(a.get("attempts") or 0)
        if not dry_run and not self.snapshot.ok and kind != "guard_reset":
            # Slurm unreachable in this tick: keep it for the retry loop
            return self._retry_later(a, now, "waiting for Slurm")
        if dry_run:
            self.store.update_action(
                aid, status="done", done_at=now, outcome="dry-run: no Slurm change"
            )
            if kind == "drain" and node:
                self.store.set_node(
                    node, babysitter_drained=True, drain_reason=reason, drained_at=now
                )
            elif kind == "resume" and node:
                self.store.set_node(node, babysitter_drained=False, drain_reason=None)
            return "done"
        status, outcome = "done", "ok"
        if kind in ("drain", "resume"):
            self.snapshot.stale = True
        try:
            if kind == "drain" and node:
                manual = a.get("rule") == "manual"
                if manual:
                    reason = f"{MANUAL_MARK} {reason}"  # the admin's: never resumed by policy
                self.slurm.drain(node, reason)
                self.store.set_node(
                    node, babysitter_drained=not manual, drain_reason=reason, drained_at=now
                )
                self.metrics.drains.labels("done").inc()
                # the drain's follow-up is an action of its own, retried like any other
                self.store.record_action(
                    "requeue_jobs",
                    node=node,
                    reason=reason,
                    rule=REQUEUE_RULE,
                    requested_by="policy",
                )
            elif kind == "resume" and node:
                self.slurm.resume(node)
                self.store.set_node(
                    node, babysitter_drained=False, drain_reason=None, consecutive_clean=0
                )
                self.metrics.resumes.labels("done").inc()
            elif kind == "requeue_jobs" and node:
                ids = self.jobs.babysat_on(node, self._job_listing)
                queued = [i for i in ids if self.jobs.record_requeue(i, [node], reason)]
                outcome = (
                    f"queued requeue of babysat job(s) {', '.join(map(str, queued))}"
                    if queued
                    else "no babysat job to requeue"
                )
            elif kind == "requeue" and job_id and a.get("rule") == REQUEUE_RULE:
                bad = [n for n in (node or "").split(",") if n]
                status, outcome = self.bounded(
                    lambda: self.jobs.execute_requeue(job_id, bad, reason, now),
                    self.item_timeout_s,
                    key=f"job {job_id}",
                )
            elif kind == "requeue" and job_id:
                self.slurm.requeue(job_id)
                self.metrics.requeues.labels("done").inc()
            elif kind == "guard_reset":
                self.store.kv_set(GUARD_KEY, False)
            else:
                raise SlurmError(f"cannot execute {kind} without its target")
        except SlurmUnavailable as exc:
            # skip the rest of this tick's Slurm calls instead of waiting out each timeout
            self.snapshot.ok = False
            return self._retry_later(a, now, f"waiting: {exc}")
        except SlurmNotOwned as exc:
            self.store.update_action(aid, status="skipped", done_at=now, outcome=str(exc))
            return "skipped"
        except (SlurmNotFound, SlurmError) as exc:
            self.store.update_action(
                aid, status="failed", done_at=now, outcome=str(exc), attempts=attempts + 1
            )
            if kind == "drain":
                self.metrics.drains.labels("failed").inc()
            if kind == "requeue" and job_id:
                self.metrics.requeues.labels("failed").inc()
            return "failed"
        self.store.update_action(
            aid, status=status, done_at=now, attempts=attempts + 1, outcome=outcome[:1000]
        )
        return status
