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
from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.episodes import start_drain_episodes
from babysitter.controller.db.store import Store, aware
from babysitter.controller.db.tickstore import Drained, NodeColumns, Outcome, Settled, settle
from babysitter.controller.loop.act.held_drain import cleared_while_held
from babysitter.controller.loop.act.job_runners import requeue, requeue_jobs
from babysitter.controller.loop.admit.admission import HOLD_RETRY_S, Act, Admission, Refusal
from babysitter.controller.loop.decide.node.decisions import Decision, DecisionKind
from babysitter.controller.loop.jobs.jobs import (
    HELD_RULE,
    REQUEUE_RULE,
    JobTracker,
    job_listing,
)
from babysitter.controller.loop.read.guard import GUARD_KEY
from babysitter.controller.loop.read.snapshot import SlurmSnapshot
from babysitter.controller.loop.record.alerts import Alert
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.finding import Severity
from babysitter.slurm.client import (
    SlurmClient,
    SlurmError,
    SlurmNotOwned,
    SlurmUnavailable,
)
from babysitter.slurm.ownership import MANUAL_MARK

log = logging.getLogger(__name__)


def node_alert(
    d: Decision,
    outcome: str,
    firing: list[Alert],
    clearing: list[tuple[str | None, str]],
    now: datetime,
) -> None:
    """The alert of a drain/resume decision, saying what became of it in Slurm."""
    if d.kind is DecisionKind.DRAIN:
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


def requeue_follow_up(node: str, reason: str, link_fault: bool = False) -> Action:
    """A drain's follow-up: requeue the node's babysat jobs, an action of its own, retried
    like any other. For a drain on a link fault (decided with the findings the drain was
    made on) its rule is the link grace: the requeues it queues are held."""
    rule = HELD_RULE if link_fault else REQUEUE_RULE
    return Action(ActionKind.REQUEUE_JOBS, node=node, reason=reason, rule=rule)


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


Batch = list[tuple[Action, Decision]]
Results = list[tuple[Action, Decision, SlurmError | None]]
# kinds whose outcome a pending run writes when it ends (with the requeues they queue)
HELD_TO_RUN_END = frozenset({ActionKind.REQUEUE, ActionKind.REQUEUE_JOBS})
# what each kind needs to be carried out; without it the action fails
NEEDS_NODE = frozenset({ActionKind.DRAIN, ActionKind.RESUME, ActionKind.REQUEUE_JOBS})


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
        admission: Admission | None = None,
    ) -> None:
        self.store = store
        # asked right before each automatic drain/resume goes to Slurm (admission.py)
        self.admission = admission
        self.slurm = slurm
        self.snapshot = snapshot  # its `ok` and `stale` are set here; our moves applied to it
        self.jobs = jobs
        self.metrics = metrics
        self.bounded = bounded  # runs one job's work with a time limit
        self.isolated = isolated  # the engine's per-item error boundary
        self.item_timeout_s = item_timeout_s
        self.batch: Batch = []  # this tick's real drains/resumes
        self.job_listing: list[Any] | None = None  # shared by this tick's requeue_jobs actions
        # the run's requeue outcomes and the requeues it queues, written when it ends
        self.closing: Settled | None = None
        # actions the admission step held: asked again on every tick (a resume in any tick may
        # make room), not only once HOLD_RETRY_S is over (that re-reads Slurm first)
        self.held: set[int] = set()
        # the tick's verdict columns a move's node write carries (record/outcome.py)
        self.node_columns: NodeColumns | None = None
        # how each kind is carried out (not in here: never executed, e.g. UNKNOWN)
        self._runners: dict[ActionKind, Callable[[Action, datetime], str]] = {
            ActionKind.DRAIN: self._drain,
            ActionKind.RESUME: self._resume,
            ActionKind.REQUEUE_JOBS: partial(requeue_jobs, self),
            ActionKind.REQUEUE: partial(requeue, self),
            ActionKind.GUARD_RESET: self._guard_reset,
        }

    # ---- completions: what a kind done in Slurm changes, written once for every path
    def _drained(self, a: Action, reason: str, s: Settled) -> None:
        """A drain done: the node marked drained (babysitter's, unless an admin's), the
        requeue of its babysat jobs queued (held when it was drained for a link fault only),
        the action done."""
        assert a.node is not None
        s.drained.append(Drained(a.node, reason, ours=not a.manual))
        link = not a.manual and self.jobs.link_fault(a.node)
        s.follow_ups.append(requeue_follow_up(a.node, reason, link))
        s.actions.append(Outcome(a.id, ActionStatus.DONE, "ok", a.attempts + 1))

    @staticmethod
    def _resumed(a: Action, s: Settled) -> None:
        """A resume done: the node ours no more, its clean count restarted, the action done."""
        assert a.node is not None
        s.resumed.append(a.node)
        s.actions.append(Outcome(a.id, ActionStatus.DONE, "ok", a.attempts + 1))

    def _count(self, a: Action, status: str) -> None:
        if a.kind is ActionKind.DRAIN and status in ("done", "failed"):
            self.metrics.drains.labels(status).inc()
        elif a.kind is ActionKind.RESUME and status == "done":
            self.metrics.resumes.labels("done").inc()
        elif a.kind is ActionKind.REQUEUE and status == "failed" and a.job_id:
            self.metrics.requeues.labels("failed").inc()

    def _slurm_error(self, a: Action, err: SlurmError, now: datetime) -> str:
        """Record what Slurm answered instead: wait for it, not ours, or failed."""
        if isinstance(err, SlurmUnavailable):
            # skip the rest of this tick's Slurm calls instead of waiting out each timeout
            self.snapshot.ok = False
            return self._retry_later(a, now, f"waiting: {err}")
        if isinstance(err, SlurmNotOwned):
            self.store.update_action(a.id, status="skipped", done_at=now, outcome=str(err))
            return "skipped"
        self.store.update_action(
            a.id, status="failed", done_at=now, attempts=a.attempts + 1, outcome=str(err)[:1000]
        )
        self._count(a, "failed")
        return "failed"

    # ---- the tick's drains and resumes, batched
    def execute_batch(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        """The tick's drains and resumes: one Slurm call per (kind, reason) group, each of
        which re-checks ownership of exactly its nodes first (a rack of 32 nodes failing
        alike is one lookup and one `scontrol update NodeName=a,b,...`)."""
        batch, self.batch = self.batch, []
        batch = self._admitted(batch, now, firing, clearing)
        if batch:
            self.snapshot.stale = True
        results = self._call_grouped(batch)
        # every outcome in one transaction; item by item if that fails
        outcomes = self.isolated("settle", lambda: self._settle_many(results, now)) or {}
        settled = []
        for a, d, err in results:
            outcome = outcomes.get(a.id) or self.isolated(
                f"action {a.kind} {d.node}", partial(self._settle, a, err, now)
            )
            node_alert(d, outcome or "failed", firing, clearing, now)
            if outcome != "pending":
                settled.append(a.id)
        self.isolated("audit", lambda: self._audit(settled, now))

    def _admitted(
        self,
        batch: Batch,
        now: datetime,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
    ) -> Batch:
        """The batch's drains and resumes the admission step lets through; the others are
        held (pending, the refusal as their outcome, asked again later)."""
        if self.admission is None or not batch:
            return batch
        first = min(a.id for a, _ in batch)
        verdicts: dict[int, Refusal | None] = {}
        for act, kind in ((Act.DRAIN, DecisionKind.DRAIN), (Act.RESUME, DecisionKind.RESUME)):
            items = [(a, d) for a, d in batch if d.kind is kind and not a.manual]
            if not items:
                continue
            got = self.admission.check(
                act, [str(d.node) for _, d in items], now, before_action=first
            )
            verdicts.update({a.id: got.get(str(d.node)) for a, d in items})
        out: Batch = []
        for a, d in batch:
            refusal = verdicts.get(a.id)
            if refusal is None:
                out.append((a, d))
                continue
            node_alert(d, self._hold(a, now, refusal), firing, clearing, now)
        return out

    def _hold(self, a: Action, now: datetime, refusal: Refusal) -> str:
        """Held by the admission step: still pending, not an attempt that failed. Written
        when the reason changes or the retry time is over (not on every tick it is asked)."""
        self.held.add(a.id)
        said = str(refusal)[:1000]
        if a.outcome != said or a.next_attempt_at is None or a.next_attempt_at <= now:
            retry = now + timedelta(seconds=HOLD_RETRY_S)
            self.store.update_action(a.id, outcome=said, next_attempt_at=retry)
        return str(refusal)

    def _call_grouped(self, batch: Batch) -> Results:
        """One Slurm call per (kind, reason) group; each action with Slurm's answer for its
        node (None: done)."""
        groups: dict[tuple[str, str], Batch] = {}
        for a, d in batch:
            key = (d.kind, d.reason if d.kind is DecisionKind.DRAIN else "")
            groups.setdefault(key, []).append((a, d))
        results: Results = []
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
        return results

    def _settle_many(self, results: Results, now: datetime) -> dict[int, str]:
        """Record the outcomes of a batch of drains/resumes in one transaction (those waiting
        for Slurm are rescheduled one by one); returns action id -> status."""
        s = Settled()
        for a, _, err in results:
            if isinstance(err, SlurmUnavailable):
                continue  # _settle reschedules it
            if isinstance(err, SlurmNotOwned):
                s.actions.append(Outcome(a.id, ActionStatus.SKIPPED, str(err)))
            elif err is not None:
                s.actions.append(Outcome(a.id, ActionStatus.FAILED, str(err)))
            elif a.kind is ActionKind.DRAIN:
                self._drained(a, a.reason or "", s)
            else:
                self._resumed(a, s)
        self._write_moves(s, now)
        out = {o.action_id: str(o.status) for o in s.actions}
        for a, _, _ in results:
            self._count(a, out.get(a.id, "pending"))
        return out

    def _settle(self, a: Action, err: SlurmError | None, now: datetime) -> str:
        """Record the outcome of a batched drain/resume of one node; returns its status."""
        if err is not None:
            return self._slurm_error(a, err, now)
        s = Settled()
        if a.kind is ActionKind.DRAIN:
            self._drained(a, a.reason or "", s)
        else:
            self._resumed(a, s)
        self._write_moves(s, now)
        self._count(a, "done")
        return "done"

    def _write_moves(self, s: Settled, now: datetime) -> None:
        """Write settled moves, applied to the snapshot first (Slurm has made them), their
        nodes' verdict columns with them: a node moved in a tick has its row written once."""
        self.snapshot.moved_here([(d.node, d.reason) for d in s.drained], s.resumed)
        if self.node_columns is not None:
            s.node_columns = self.node_columns.columns([d.node for d in s.drained] + s.resumed)
        settle(self.store, s, now)
        if self.node_columns is not None:
            self.node_columns.written(s.node_columns)

    # ---- pending actions, one by one
    def run_pending(self, pending: list[Action], now: datetime) -> None:
        listed = {a.id for a in pending}
        held, newest = self.held & listed, max(listed, default=0)
        self.held = {i for i in self.held if i > newest}  # held this tick: asked from the next
        due = [a for a in pending if a.id in held or not ((nxt := a.next_attempt_at) and nxt > now)]
        self.job_listing = job_listing(self.slurm, self.snapshot.ok, due)
        # one lookup of the pending requeues, one write of the jobs' outcomes and of the
        # requeues they queue, and one audit for a rack (not one per node or job)
        settled: list[int] = []
        lost: set[int] = set()  # settled, but their outcome could not be written
        jobs = [a.job_id for a in due if a.kind is ActionKind.REQUEUE and a.job_id]
        try:
            with self.jobs.pending.kept(), self.jobs.history.kept(jobs):
                self.closing = Settled()
                try:
                    for a in due:
                        if a.kind not in HELD_TO_RUN_END:
                            lost |= self._close_run(now)  # what it counts or reads sees them
                        if self._execute_guarded(a, now) != "pending":
                            settled.append(a.id)
                            self.jobs.pending.settled(a)  # a requeue run is no longer pending
                finally:
                    lost |= self._close_run(now)
        finally:
            self.job_listing = None
            self.closing = None
        self.isolated("audit", lambda: self._audit([i for i in settled if i not in lost], now))

    def _close_run(self, now: datetime) -> set[int]:
        """Write what the run's requeues held so far: their jobs' rows, their outcomes and
        the requeues queued (one transaction). Until then their actions read pending: a run
        cut short (the controller stopped, the write failed) carries them out again, and a
        job's requeue asks Slurm first (jobs/requeue.py: a requeued job is not running).
        Returns the actions whose outcome could not be written (not audited: still pending)."""
        s, self.closing = self.closing, Settled()

        def write() -> bool:
            self.jobs.history.flush()  # the jobs' rows first: an outcome says they are written
            if s is not None:
                settle(self.store, s, now)
            return True

        if self.isolated("settle", write):
            return set()
        return {o.action_id for o in (s.actions if s is not None else [])}

    def _retry_later(self, a: Action, now: datetime, why: str) -> str:
        delay = min(30.0, 0.5 * 2**a.attempts)
        self.store.update_action(
            a.id,
            attempts=a.attempts + 1,
            outcome=why[:1000],
            next_attempt_at=now + timedelta(seconds=delay),
        )
        return "pending"

    def execute(self, a: Action, now: datetime) -> str:
        """Run one action in its own error boundary and audit it once it has settled;
        returns its new status."""
        status = self._execute_guarded(a, now)
        if status != "pending":
            self.isolated("audit", lambda: self._audit([a.id], now))
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

    def _execute_guarded(self, a: Action, now: datetime) -> str:
        try:
            return self._execute_one(a, now)
        except Exception as exc:  # a bug or a hostile input: recorded on this action only
            log.exception("action %s (%s) failed", a.id, a.kind)
            self.metrics.loop_errors.labels("action").inc()
            try:
                self.store.update_action(
                    a.id,
                    status="failed",
                    done_at=now,
                    attempts=a.attempts + 1,
                    outcome=f"error: {type(exc).__name__}: {str(exc)[:500]}",
                )
            except Exception:
                log.exception("cannot record the failure of action %s", a.id)
            return "failed"

    def _execute_one(self, a: Action, now: datetime) -> str:
        if (cleared := cleared_while_held(self.store, a)) is not None:
            return self.done(a, "skipped", cleared, now)  # stale evidence: not drained
        if not a.dry_run and not self.snapshot.ok and a.kind is not ActionKind.GUARD_RESET:
            # Slurm unreachable in this tick: keep it for the retry loop
            return self._retry_later(a, now, "waiting for Slurm")
        if a.dry_run:
            return self._dry_run(a, now)
        if a.kind in (ActionKind.DRAIN, ActionKind.RESUME) and a.node:
            if (refusal := self._refusal(a, now)) is not None:
                self._hold(a, now, refusal)
                return "pending"
            self.snapshot.stale = True
        run = self._runners.get(a.kind)
        try:
            if run is None or not self._has_target(a):
                raise SlurmError(f"cannot execute {a.kind} without its target")
            return run(a, now)
        except SlurmError as exc:
            return self._slurm_error(a, exc, now)

    def _refusal(self, a: Action, now: datetime) -> Refusal | None:
        """The admission step's word on an automatic drain/resume (an admin's own request is
        theirs: Slurm's ownership check still applies to it)."""
        if self.admission is None or a.manual or not a.node:
            return None
        act = Act.DRAIN if a.kind is ActionKind.DRAIN else Act.RESUME
        return self.admission.check(act, [a.node], now, before_action=a.id)[a.node]

    @staticmethod
    def _has_target(a: Action) -> bool:
        if a.kind in NEEDS_NODE:
            return bool(a.node)
        return bool(a.job_id) if a.kind is ActionKind.REQUEUE else True

    def _dry_run(self, a: Action, now: datetime) -> str:
        """A dry-run drain/resume changes only babysitter's own view of the node."""
        self.store.update_action(
            a.id, status="done", done_at=now, outcome="dry-run: no Slurm change"
        )
        if a.kind is ActionKind.DRAIN and a.node:
            self.store.set_node(
                a.node, babysitter_drained=True, drain_reason=a.reason or "", drained_at=now
            )
            if not a.manual:  # babysitter's drain: a new validation history (episodes.py)
                start_drain_episodes(self.store, [a.node])
        elif a.kind is ActionKind.RESUME and a.node:
            self.store.set_node(a.node, babysitter_drained=False, drain_reason=None)
        return "done"

    def done(self, a: Action, status: str, outcome: str, now: datetime) -> str:
        if self.closing is not None and a.kind in HELD_TO_RUN_END:
            self.closing.actions.append(
                Outcome(a.id, ActionStatus(status), outcome, attempts=a.attempts + 1)
            )
            return status
        self.store.update_action(
            a.id, status=status, done_at=now, attempts=a.attempts + 1, outcome=outcome[:1000]
        )
        return status

    # ---- one runner per kind: carry it out, then record its completion
    def _drain(self, a: Action, now: datetime) -> str:
        assert a.node is not None
        reason = a.reason or ""
        if a.manual:
            reason = f"{MANUAL_MARK} {reason}"  # the admin's: never resumed by policy
        self.slurm.drain(a.node, reason)
        s = Settled()
        self._drained(a, reason, s)
        # the next action's admission counts it (the listing is older than this drain)
        self._write_moves(s, now)
        self._count(a, "done")
        return "done"

    def _resume(self, a: Action, now: datetime) -> str:
        assert a.node is not None
        # an admin's resume may take back an admin's drain; the policy's may not
        self.slurm.resume(a.node, manual=a.manual)
        s = Settled()
        self._resumed(a, s)
        self._write_moves(s, now)
        self._count(a, "done")
        return "done"

    def _guard_reset(self, a: Action, now: datetime) -> str:
        self.store.kv_set(GUARD_KEY, False)
        return self.done(a, "done", "ok", now)
