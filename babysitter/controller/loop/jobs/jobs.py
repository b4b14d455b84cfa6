"""Babysat jobs: track them from Slurm (AdminComment `babysit=<args>`, or the `--comment`
fallback) and, when their node is drained for a fault (or Slurm marks it down; or their own
NCCL reported a network failure: nccl_requeue.py), requeue them from the newest complete
checkpoint: write `<ckpt>/.babysitter/resume.json`, requeue, keep the
bad node(s) out, count it. Past max_requeues the job is held and on-call is told (one alert per
job, resolved when the job ends or is released). Jobs that did not opt in are left to Slurm.
One fault -> one requeue.

Split in two: `decide_requeue` is the pure job policy (facts in, a decision out); `JobTracker`
gathers the facts and executes. Requeues are actions in the same pending/retry pipeline as
drains: the tracker only *records* them (`record_requeue`); the remediation engine executes
them (`execute_requeue`), retrying while Slurm is unavailable. Every job is handled in its own
error boundary: a hostile or broken job records its error in its history and never stops the
others."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Protocol, TypeVar

from babysitter.checkpoints import owner as ckpt_owner
from babysitter.config import Config
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.store import HistoryEntry, JobRow, Store
from babysitter.controller.loop.admit.gate import AdmittedSlurm
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
from babysitter.controller.loop.decide.policy import Rule
from babysitter.controller.loop.record.alerts import Alert, AlertRouter
from babysitter.controller.loop.record.alerts.owners import JobOwners
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.finding import Severity
from babysitter.job import BabysitSpec, parse_babysit_args
from babysitter.slurm.client import SlurmClient, SlurmError, SlurmJob, SlurmNode, SlurmNotFound

log = logging.getLogger(__name__)
DEFAULT_MAX_REQUEUES = 3
CKPT_SETTLE_S = 10.0  # marker-less formats: files this fresh may still be being written
REQUEUE_RULE = Rule.JOB_ON_FAILED_NODE
HELD_RULE = Rule.JOB_LINK_GRACE  # a requeue held while a link fault may heal (link_hold.py)
NCCL_RULE = Rule.JOB_NCCL_NETWORK  # its own NCCL's network failure (nccl_requeue.py)
HISTORY_MAX = 50  # entries kept per job (a job failing every tick must not grow a row forever)
HELD_REASONS = ("JobHeldAdmin", "JobHeldUser")
T = TypeVar("T")


class Bounded(Protocol):
    """Runs one job's work with a time limit (the engine's worker pool): fn, timeout, key."""

    def __call__(self, fn: Callable[[], T], timeout_s: float, key: str, /) -> T: ...


def _inline(fn: Callable[[], T], timeout_s: float, key: str, /) -> T:
    return fn()


# ---- the pure job policy


@dataclass(frozen=True)
class JobDecision:
    kind: str  # requeue | hold | skip
    why: str = ""


def max_requeues(spec: Mapping[str, object]) -> int:
    """The job's limit, from user-controlled text: ASCII digits only, bounded."""
    raw = spec.get("max_requeues", DEFAULT_MAX_REQUEUES)
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ValueError(f"max_requeues {raw!r} is not a number")
    text = str(raw)
    if not (text.isascii() and text.isdigit()) or len(text) > 8:
        raise ValueError(f"max_requeues {text[:20]!r} is not a small ASCII number")
    return int(text)


def decide_requeue(
    restart_count: int, requeues_done: int, history: list[HistoryEntry], limit: int
) -> JobDecision:
    """Requeue, hold (limit reached) or skip (this restart generation was handled already)."""
    for h in history:
        if h.get("restart_count") == restart_count and h.get("event") in ("requeue", "held"):
            return JobDecision(
                "skip", f"restart {restart_count} already handled ({h.get('event')})"
            )
    if requeues_done >= limit:
        return JobDecision("hold", f"max_requeues={limit} reached")
    return JobDecision("requeue")


# ---- facts and execution


def babysit_spec(j: SlurmJob) -> BabysitSpec | None:
    """The job's babysit arguments (AdminComment from the plugin, else the Comment fallback);
    None when it did not opt in. Raises on an invalid spec, so the job's error can be shown
    instead of the job being dropped silently."""
    for text in (j.admin_comment, j.comment):
        for token in (text or "").split():
            if token == "babysit" or token.startswith("babysit="):
                return parse_babysit_args(token)
    return None


def _clamp(text: str | None, n: int) -> str | None:
    return None if text is None else text[:n]


def heartbeat_age(ckpt: str, job_id: int, now_ts: float, user: str | None = None) -> float | None:
    """Seconds since the job's last progress signal: its heartbeat file (written by
    babysitter.job.heartbeat), else the newest file under its checkpoint directory. Read as
    the job's owner `user` (None: as this process), see babysitter.checkpoints.owner."""
    return ckpt_owner.heartbeat_age(ckpt, user, job_id, now_ts)


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
        self._hb_read: dict[int, float] = {}  # job -> monotonic time of its last heartbeat read
        # job -> what the scan last wrote of it: an unchanged job is not rewritten every scan
        # (thousands of babysat jobs, one transaction each, every job_scan_s)
        self._scanned: dict[int, dict[str, object]] = {}
        # each job's Slurm user, from the listing each scan reads: the owner of its job alerts
        self.owners = JobOwners()
        router.owner_of = self.owners

    # -- recording history and errors on the job
    def _history(self, job_id: int) -> list[HistoryEntry]:
        row = self._row(job_id)
        return list((row or {}).get("history") or [])

    def _row(self, job_id: int) -> JobRow | None:
        return next((r for r in self.store.jobs() if r.get("job_id") == job_id), None)

    def _append(self, job_id: int, entry: HistoryEntry, **values: object) -> None:
        history = self._history(job_id)
        history.append(entry)
        self._scanned.pop(job_id, None)  # the row moved: the next scan writes it again
        self.store.upsert_job(job_id, history=history[-HISTORY_MAX:], **values)

    def record_error(self, job_id: int, what: str, exc: BaseException, now: datetime) -> None:
        """A job whose handling failed: the error goes into its history (shown by
        /api/v1/jobs and `babysitter jobs`), once per distinct error."""
        err = f"{what}: {type(exc).__name__}: {str(exc)[:300]}"
        try:
            history = self._history(job_id)
            last = history[-1] if history else None
            if last and last.get("event") == "error" and last.get("error") == err:
                return  # recorded (and logged) once
            log.warning("job %s: %s", job_id, err)
            self._append(job_id, {"event": "error", "at": now.isoformat(), "error": err})
        except Exception:
            log.exception("cannot record the error of job %s", job_id)

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
        # forget jobs that left the queue: a long-running controller sees millions of job ids
        live = {j.job_id for j in jobs}
        for gone in self._hb_read.keys() - live:
            del self._hb_read[gone]
        for gone in self._scanned.keys() - live:
            del self._scanned[gone]

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
            self._write_scan(j.job_id, seen)
            given = next(
                (t for t in f"{j.admin_comment} {j.comment}".split() if t.startswith("babysit")),
                "",
            )
            raise ValueError(f"babysit spec {given[:100]!r} refused: {exc}") from exc
        if spec is None:
            return
        self._write_scan(j.job_id, {"babysit": spec, **seen})
        max_requeues(spec)  # a bad limit is this job's error, found before any fault
        bad = sorted(down & set(j.nodes))
        if j.running and bad:
            self.record_requeue(j.job_id, bad, f"node {', '.join(bad)} is DOWN", now=now)
        elif j.running and spec.get("hang_timeout") and spec.get("ckpt"):
            self._check_hang(j, spec, now)

    def _write_scan(self, job_id: int, values: dict[str, object]) -> None:
        if self._scanned.get(job_id) == values:
            return
        self.store.upsert_job(job_id, **values)
        self._scanned[job_id] = values

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
        for a in self.store.actions(status=ActionStatus.PENDING, limit=5000):
            if a.kind is not ActionKind.REQUEUE or a.job_id != job_id:
                continue
            if a.rule == HELD_RULE and hold_until is None:
                nodes = sorted({*(a.node or "").split(","), *bad_nodes} - {""})
                self.store.update_action(
                    a.id,
                    rule=str(rule),
                    node=",".join(nodes)[:255] or None,
                    reason=f"{a.reason or ''}; then {why}"[:1000],
                    outcome="hold ended: another fault",
                    **({"next_attempt_at": now} if now is not None else {}),
                )
            return None
        aid = self.store.record_action(
            ActionKind.REQUEUE,
            node=",".join(bad_nodes)[:255] if bad_nodes else None,
            job_id=job_id,
            reason=why,
            rule=rule if hold_until is None else HELD_RULE,
            requested_by="policy",
        )
        if hold_until is not None:
            at = now or hold_until
            self.store.update_action(
                aid,
                next_attempt_at=min(hold_until, at + timedelta(seconds=POLL_S)),
                outcome=f"held until {hold_until.isoformat(timespec='seconds')}: a link fault "
                "NCCL may ride out ([policy] link_requeue_grace_s)",
            )
            self._append(
                job_id,
                {
                    "event": "requeue_held",
                    "at": at.isoformat(),
                    "until": hold_until.isoformat(),
                    "why": why[:500],
                },
            )
        return aid

    # -- a requeue held for a link fault's grace (the policy: link_hold.py)
    def link_fault(self, node: str) -> bool:
        """`node` (being drained) has only link faults open and the link grace is on: its
        babysat jobs' requeue is to be held."""
        row = self.store.node(node) or {}
        return grace_for(row.get("open_findings") or [], self.cfg.policy.link_requeue_grace_s) > 0

    def _hold_until(self, job_id: int, now: datetime) -> datetime:
        """The end of the job's grace, from its history (none recorded: over now)."""
        for h in reversed(self._history(job_id)):
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
            self._append(
                job_id, {"event": "requeue_released", "at": now.isoformat(), "why": d.why[:500]}
            )
            return "skipped", f"not requeued: {d.why}"
        status, outcome = self.execute_requeue(
            job_id, nodes, f"{why}; {d.why}", now, failed_ok=True
        )
        return status, f"{d.why}: {outcome}"

    # -- hang
    def gpus_idle(self, nodes: tuple[str, ...]) -> bool | None:
        """True when every GPU on the job's nodes is below the idle threshold in their latest
        reports; None when no node reported utilisation (no GPUs, or an old agent)."""
        limit = self.cfg.policy.idle_gpu_util_percent
        seen = False
        for name in nodes:
            row = self.store.node(name)
            util = ((row or {}).get("metrics") or {}).get("gpu_util") or {}
            for v in util.values():
                seen = True
                if float(v) >= limit:
                    return False
        return True if seen else None

    def _check_hang(self, j: SlurmJob, spec: BabysitSpec, now: datetime) -> None:
        # each read starts a helper process as the job's owner: at most every hang_timeout/10 s
        if time.monotonic() - self._hb_read.get(j.job_id, -1e9) < max(
            self.cfg.slurm.job_scan_s, spec["hang_timeout"] / 10
        ):
            return
        self._hb_read[j.job_id] = time.monotonic()
        age = heartbeat_age(spec["ckpt"], j.job_id, now.timestamp(), j.user)
        cond = f"job_hung_{j.job_id}"
        # no progress for hang_timeout AND its GPUs idle (when utilisation is known): a slow
        # step that keeps the GPUs busy is not a hang
        hung = (
            age is not None and age > spec["hang_timeout"] and self.gpus_idle(j.nodes) is not False
        )
        if hung and age is not None:
            requeue = self.cfg.policy.requeue_hung_jobs
            why = (
                f"job {j.job_id} ({j.name[:100]}) on {','.join(j.nodes)} made no progress for "
                f"{age:.0f} s (hang_timeout {spec['hang_timeout']} s) with idle GPUs"
            )
            self.router.process(
                [
                    Alert(
                        None,
                        cond,
                        Severity.WARNING,
                        why,
                        "requeued it from its last checkpoint"
                        if requeue
                        else "nothing changed: the job keeps its nodes",
                        now,
                        details={"job_id": j.job_id},
                    )
                ],
                [],
                now,
            )
            if requeue:
                self.record_requeue(j.job_id, [], why)
        elif age is not None:
            self.router.process([], [(None, cond)], now)

    # -- execution of a recorded requeue action
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
        j = self.slurm.job(job_id)
        died = failed_ok and job_phase(j.states) == "failed"
        if not (j.running or "COMPLETING" in j.states or died):
            return "skipped", f"job {job_id} is {j.state or 'gone'}: nothing to requeue"
        spec = babysit_spec(j) or {}
        row = self._row(job_id) or {}
        history: list[HistoryEntry] = list(row.get("history") or [])
        limit = max_requeues(spec)
        d = decide_requeue(j.restart_count, int(row.get("requeues") or 0), history, limit)
        if d.kind == "skip":
            return "skipped", d.why
        if d.kind == "hold":
            return self._hold(j, bad_nodes, why, now, limit)
        resume_point = None
        ckpt = spec.get("ckpt")
        explanation = "no checkpoint directory given: restarts from scratch"
        if ckpt:
            # as the job's owner, in a bounded helper process: never raises
            outcome = ckpt_owner.prepare_resume(
                ckpt, j.user, j.job_id, j.restart_count + 1, settle_s=CKPT_SETTLE_S
            )
            resume_point, explanation = outcome.resume_point, outcome.explanation
        exclude = self._exclude(j, bad_nodes)
        AdmittedSlurm(self.slurm).requeue(j.job_id, exclude=exclude)  # the job's, never a node's
        self.metrics.requeues.labels("done").inc()
        history.append(
            {
                "event": "requeue",
                "at": now.isoformat(),
                "restart_count": j.restart_count,
                "excluded": exclude,
                "resume_point": resume_point,
                "why": why[:500],
                "checkpoint": explanation[:500],
            }
        )
        self._scanned.pop(j.job_id, None)  # the row moved: the next scan writes it again
        self.store.upsert_job(
            j.job_id,
            requeues=int(row.get("requeues") or 0) + 1,
            resume_point=resume_point,
            history=history[-HISTORY_MAX:],
            babysit=spec,
            nodes=list(j.nodes),
            state="REQUEUED",
        )
        return "done", (
            f"requeued, excluding {','.join(exclude) or 'nothing'}; resume from "
            f"{resume_point or 'scratch'}"
        )

    def _exclude(self, j: SlurmJob, bad_nodes: list[str]) -> list[str]:
        """The bad nodes to keep out, unless that leaves the job nowhere to run: a job whose
        required node list (--nodelist) names a bad node would pend forever. Then the bad node
        stays out of the exclude list and on-call is told (Slurm keeps the node drained, so
        the job waits for it visibly rather than silently)."""
        required = set(j.extra.get("required_nodes", "").split(",")) - {""}
        stuck = sorted(required & set(bad_nodes))
        if not stuck:
            return list(bad_nodes)
        self.router.process(
            [
                Alert(
                    None,
                    f"job_unplaceable_{j.job_id}",
                    Severity.WARNING,
                    f"job {j.job_id} ({j.name[:100]}) requires node(s) {','.join(stuck)}, "
                    "which babysitter drained: it waits for them to be resumed",
                    f"requeued job {j.job_id} without excluding {','.join(stuck)}",
                    datetime.now().astimezone(),
                    details={"job_id": j.job_id},
                )
            ],
            [],
        )
        return [n for n in bad_nodes if n not in stuck]

    def _hold(
        self, j: SlurmJob, bad_nodes: list[str], why: str, now: datetime, limit: int
    ) -> tuple[str, str]:
        # requeue held: off the broken node, kept in the queue for a human
        AdmittedSlurm(self.slurm).requeue(j.job_id, exclude=bad_nodes, hold=True)
        self._append(
            j.job_id,
            {"event": "held", "at": now.isoformat(), "restart_count": j.restart_count, "why": why},
            state="HELD",
        )
        self.router.process(
            [
                Alert(
                    None,
                    f"job_requeue_limit_{j.job_id}",
                    Severity.WARNING,
                    f"job {j.job_id} ({j.name[:100]}) hit max_requeues={limit} after: {why}",
                    f"requeued job {j.job_id} held, excluding {','.join(bad_nodes)}",
                    now,
                    details={"job_id": j.job_id},
                )
            ],
            [],
            now,
        )
        return "done", "requeued held (max_requeues reached)"

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
