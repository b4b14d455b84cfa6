"""Babysat jobs: track them from Slurm (AdminComment `babysit=<args>`, or the `--comment`
fallback) and, when their node is drained for a fault (or Slurm marks it down; or their own
NCCL reported a network failure: nccl_requeue.py), requeue them from the newest complete
checkpoint: write `<ckpt>/.babysitter/resume.json`, requeue, keep the
bad node(s) out, count it. Past max_requeues the job is held and on-call is told (one alert per
job, resolved when the job ends or is released). Jobs that did not opt in are left to Slurm.
One fault -> one requeue.

The pieces: job_policy.py is the pure job policy (facts in, a decision out); `JobTracker`
gathers the facts, records requeues and holds them for a link fault's grace; requeue.py
executes a requeue, hang.py watches for hangs, job_history.py writes the job's row. Requeues
are actions in the same pending/retry pipeline as drains: the tracker only *records* them
(`record_requeue`); the remediation engine executes them (`execute_requeue`), retrying while
Slurm is unavailable. Every job is handled in its own error boundary: a hostile or broken job
records its error in its history and never stops the others."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Protocol, TypeVar

from babysitter.config import Config
from babysitter.controller.db.actions import Action, ActionKind
from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import open_findings
from babysitter.controller.loop.decide.link_hold import (
    DOWN_CODES,
    LINK_CODES,
    POLL_S,
    HoldFacts,
    critical,
    decide_hold,
    grace_for,
    job_phase,
)
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.jobs.hang import HangWatch
from babysitter.controller.loop.jobs.job_history import JobHistory
from babysitter.controller.loop.jobs.job_policy import babysit_spec, max_requeues
from babysitter.controller.loop.jobs.pending_requeues import PendingRequeues
from babysitter.controller.loop.jobs.requeue import Requeuer
from babysitter.controller.loop.record.alerts import AlertRouter
from babysitter.controller.loop.record.alerts.owners import JobOwners
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.slurm.client import SlurmClient, SlurmError, SlurmJob, SlurmNode, SlurmNotFound

log = logging.getLogger(__name__)
REQUEUE_RULE = Rule.JOB_ON_FAILED_NODE
HELD_RULE = Rule.JOB_LINK_GRACE  # a requeue held while a link fault may heal (link_hold.py)
NCCL_RULE = Rule.JOB_NCCL_NETWORK  # its own NCCL's network failure (nccl_requeue.py)
HELD_REASONS = ("JobHeldAdmin", "JobHeldUser")
T = TypeVar("T")


class Bounded(Protocol):
    """Runs one job's work with a time limit (the engine's worker pool): fn, timeout, key."""

    def __call__(self, fn: Callable[[], T], timeout_s: float, key: str, /) -> T: ...


def _inline(fn: Callable[[], T], timeout_s: float, key: str, /) -> T:
    return fn()


def _clamp(text: str | None, n: int) -> str | None:
    return None if text is None else text[:n]


def job_listing(slurm: SlurmClient, slurm_ok: bool, due: list[Action]) -> list[SlurmJob] | None:
    """One job listing for all of the tick's requeue_jobs (None: each asks on its own)."""
    nodes = [a.node for a in due if a.kind is ActionKind.REQUEUE_JOBS and a.node]
    if not nodes or not slurm_ok:
        return None
    try:
        return slurm.jobs_on(nodes)
    except SlurmError:
        return None


class JobTracker:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        slurm: SlurmClient,
        metrics: ControllerMetrics,
        router: AlertRouter,
        bounded: Bounded | None = None,
        item_timeout_s: float = 30.0,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.slurm = slurm
        self.metrics = metrics
        self.router = router
        # runs one job's work with a time limit (the engine's worker pool); inline when None
        self.bounded: Bounded = bounded or _inline
        self.item_timeout_s = item_timeout_s
        self._last_scan = 0.0
        self.history = JobHistory(store)
        self.pending = PendingRequeues(store)  # record_requeue's once-per-job lookup
        self.hang = HangWatch(cfg, store, router, self.record_requeue)
        self.requeuer = Requeuer(slurm, metrics, router, self.history)
        # each job's Slurm user, from the listing each scan reads: the owner of its job alerts
        self.owners = JobOwners()
        router.owner_of = self.owners

    def record_error(self, job_id: int, what: str, exc: BaseException, now: datetime) -> None:
        """A job whose handling failed: the error goes into its history (shown by
        /api/v1/jobs and `babysitter jobs`), once per distinct error."""
        self.history.record_error(job_id, what, exc, now)

    # -- the scan
    def tick(self, slurm_nodes: dict[str, SlurmNode], now: datetime) -> None:
        """Refresh the jobs table; queue requeues of babysat jobs stranded on nodes Slurm
        marked DOWN; watch hangs; resolve requeue-limit alerts of jobs that ended or were
        released."""
        if time.monotonic() - self._last_scan < self.cfg.slurm.job_scan_s:
            return
        self._last_scan = time.monotonic()
        try:
            jobs = self.slurm.jobs()
        except SlurmError as exc:
            log.debug("cannot list jobs: %s", exc)
            return
        self.owners.remember(jobs)
        down = {n for n, sn in slurm_nodes.items() if sn.down}
        for j in jobs:
            try:
                self.bounded(
                    partial(self._scan_one, j, down, now), self.item_timeout_s, f"job {j.job_id}"
                )
            except Exception as exc:
                self.record_error(j.job_id, "scan", exc, now)
        self._resolve_requeue_limit_alerts({j.job_id: j for j in jobs})
        live = {j.job_id for j in jobs}
        self.hang.forget_all_but(live)
        self.history.forget_all_but(live)

    def _scan_one(self, j: SlurmJob, down: set[str], now: datetime) -> None:
        seen: dict[str, object] = {
            "name": _clamp(j.name, 255),
            "user": _clamp(j.user, 64),
            "nodes": list(j.nodes),
            "state": "+".join(j.states)[:64],
            "restart_count": j.restart_count,
        }
        try:
            spec = babysit_spec(j)
        except Exception as exc:
            # a babysit spec this parser chokes on: the job opted in, so show why it is not
            # babysat rather than dropping it silently
            self.history.write_scan(j.job_id, seen)
            given = next(
                (t for t in f"{j.admin_comment} {j.comment}".split() if t.startswith("babysit")),
                "",
            )
            raise ValueError(f"babysit spec {given[:100]!r} refused: {exc}") from exc
        if spec is None:
            return
        self.history.write_scan(j.job_id, {"babysit": spec, **seen})
        max_requeues(spec)  # a bad limit is this job's error, found before any fault
        bad = sorted(down & set(j.nodes))
        if j.running and bad:
            self.record_requeue(j.job_id, bad, f"node {', '.join(bad)} is DOWN", now=now)
        elif j.running and spec.get("hang_timeout") and spec.get("ckpt"):
            self.hang.check(j, spec, now)

    def babysat_on(self, node: str, jobs: list[SlurmJob] | None = None) -> list[int]:
        """Babysat jobs running on `node` (SlurmError when Slurm cannot be asked). `jobs`: a
        listing shared by every node drained in the same tick (one Slurm call for all)."""
        out = []
        for j in self.slurm.jobs_on([node]) if jobs is None else jobs:
            if node not in j.nodes or not (j.running or "COMPLETING" in j.states):
                continue
            try:
                if babysit_spec(j) is not None:
                    out.append(j.job_id)
            except Exception:  # its error is recorded by the scan
                continue
        return out

    def record_requeue(
        self,
        job_id: int,
        bad_nodes: list[str],
        why: str,
        hold_until: datetime | None = None,
        now: datetime | None = None,
        rule: Rule = REQUEUE_RULE,
    ) -> int | None:
        """Queue a requeue action (once: not while one for this job is pending). With
        `hold_until`: held for a link fault's grace (link_hold.py), looked at every POLL_S; a
        requeue without a hold asked for while one is held makes it a plain requeue (`rule`),
        due now (another fault: nothing left to wait for)."""
        new = self._requeue_action(job_id, bad_nodes, why, hold_until, now, rule)
        if new is None:
            return None
        row = self.store.record(new)
        aid = row.id
        if hold_until is not None:
            at = now or hold_until
            row = replace(
                row,
                next_attempt_at=min(hold_until, at + timedelta(seconds=POLL_S)),
                outcome=f"held until {hold_until.isoformat(timespec='seconds')}: a link fault "
                "NCCL may ride out ([policy] link_requeue_grace_s)",
            )
            self.store.update_action(aid, next_attempt_at=row.next_attempt_at, outcome=row.outcome)
            self.history.append(
                job_id,
                {
                    "event": "requeue_held",
                    "at": at.isoformat(),
                    "until": hold_until.isoformat(),
                    "why": why[:500],
                },
            )
        self.pending.wrote(row)
        return aid

    def requeue_action(
        self, job_id: int, bad_nodes: list[str], why: str, now: datetime | None = None
    ) -> Action | None:
        """`record_requeue`'s plain requeue, not written: the action to record (the caller
        writes it with others), None when one is pending already. The pending lookup counts
        it from now on."""
        new = self._requeue_action(job_id, bad_nodes, why, None, now, REQUEUE_RULE)
        if new is not None:
            self.pending.wrote(new)
        return new

    def _requeue_action(
        self,
        job_id: int,
        bad_nodes: list[str],
        why: str,
        hold_until: datetime | None,
        now: datetime | None,
        rule: Rule,
    ) -> Action | None:
        """The requeue action to record; None while one for this job is pending (a held one
        asked for without a hold becomes a plain one, due now)."""
        a = self.pending.of(job_id)
        if a is not None:
            if a.rule == HELD_RULE and hold_until is None:
                self._end_hold(a, bad_nodes, why, rule, now)
            return None
        return Action(
            ActionKind.REQUEUE,
            node=",".join(bad_nodes)[:255] if bad_nodes else None,
            job_id=job_id,
            reason=why,
            rule=rule if hold_until is None else HELD_RULE,
            requested_by="policy",
        )

    def _end_hold(
        self, a: Action, bad_nodes: list[str], why: str, rule: Rule, now: datetime | None
    ) -> None:
        """A held requeue becomes a plain one (`rule`), due now: another fault."""
        nodes = sorted({*(a.node or "").split(","), *bad_nodes} - {""})
        changed = replace(
            a,
            rule=str(rule),
            node=",".join(nodes)[:255] or None,
            reason=f"{a.reason or ''}; then {why}"[:1000],
            outcome="hold ended: another fault",
            next_attempt_at=a.next_attempt_at if now is None else now,
        )
        values = {k: getattr(changed, k) for k in ("rule", "node", "reason", "outcome")}
        if now is not None:
            values["next_attempt_at"] = now
        self.store.update_action(a.id, **values)
        self.pending.wrote(changed)

    # -- a requeue held for a link fault's grace (the policy: link_hold.py)
    def link_fault(self, node: str) -> bool:
        """`node` (being drained) has only link faults open and the link grace is on: its
        babysat jobs' requeue is to be held."""
        found = open_findings(self.store, [node]).get(node, [])
        return grace_for(found, self.cfg.policy.link_requeue_grace_s) > 0

    def _hold_until(self, job_id: int, now: datetime) -> datetime:
        """The end of the job's grace, from its history (none recorded: over now)."""
        for h in reversed(self.history.entries(job_id)):
            if h.get("event") == "requeue_held" and h.get("until"):
                try:
                    return datetime.fromisoformat(str(h.get("until")))
                except ValueError:
                    break
        return now

    def hold_facts(self, job_id: int, nodes: list[str], down: set[str], now: datetime) -> HoldFacts:
        """What decide_hold reads: the job's state in Slurm, and for the hold's nodes whether
        babysitter still drains them, whether a port is down now (from a fresh report) and
        whether anything else is wrong (another critical finding, Slurm marked it DOWN)."""
        try:
            j = self.slurm.job(job_id)
            phase, state = job_phase(j.states), j.state
        except SlurmNotFound:
            phase, state = "ended", "gone"
        drained, other = False, []
        link_down: bool | None = False
        stale_after = self.cfg.controller.heartbeat_timeout_s
        for name in nodes:
            row = self.store.node(name) or {}
            drained = drained or bool(row.get("babysitter_drained"))
            last = row.get("last_report_at")
            crit = critical(row.get("open_findings") or [])
            other += [f"{name}: {f.code}" for f in crit if f.code not in LINK_CODES]
            if name in down:
                other.append(f"{name} is DOWN in Slurm")
            if any(f.code in DOWN_CODES for f in crit):
                link_down = True
            elif last is None or (now - last).total_seconds() > stale_after:
                link_down = link_down or None  # unknown, unless another node is down
        return HoldFacts(
            now=now,
            until=self._hold_until(job_id, now),
            job=phase,
            job_state=state,
            drained=drained,
            link_down=link_down,
            other_fault=", ".join(other)[:300],
        )

    def execute_held(
        self, job_id: int, nodes: list[str], why: str, down: set[str], now: datetime
    ) -> tuple[str, str]:
        """(status, outcome) of one look at a held requeue: `pending` while it waits."""
        d = decide_hold(self.hold_facts(job_id, nodes, down, now))
        if d.kind == "wait":
            return "pending", f"held: {d.why}"
        if d.kind == "release":
            self.history.append(
                job_id, {"event": "requeue_released", "at": now.isoformat(), "why": d.why[:500]}
            )
            return "skipped", f"not requeued: {d.why}"
        status, outcome = self.execute_requeue(
            job_id, nodes, f"{why}; {d.why}", now, failed_ok=True
        )
        return status, f"{d.why}: {outcome}"

    # -- execution of a recorded requeue action (requeue.py)
    def execute_requeue(
        self,
        job_id: int,
        bad_nodes: list[str],
        why: str,
        now: datetime,
        failed_ok: bool = False,
    ) -> tuple[str, str]:
        """(status, outcome) of one requeue action. SlurmUnavailable propagates: the action
        stays pending and is retried. `failed_ok`: a job that failed by itself is requeued
        too (a held requeue: the link killed it during the grace)."""
        return self.requeuer.execute(job_id, bad_nodes, why, now, failed_ok)

    def _resolve_requeue_limit_alerts(self, jobs: dict[int, SlurmJob]) -> None:
        """One requeue-limit alert per job: resolved once the job is no longer held (released
        by a human, cancelled, or finished)."""
        clearing: list[tuple[str | None, str]] = []
        for key in self.router.firing_keys():
            _, _, cond = key.partition("|")
            if not cond.startswith("job_requeue_limit_"):
                continue
            tail = cond.removeprefix("job_requeue_limit_")
            if not tail.isdigit():
                continue
            j = jobs.get(int(tail))
            if j is None or not (j.pending and j.state_reason in HELD_REASONS):
                clearing.append((None, cond))
        if clearing:
            self.router.process([], clearing)
