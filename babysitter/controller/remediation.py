"""The remediation engine: every tick, gather facts (store + Slurm), run the pure policy, and
execute its decisions through the Slurm client, recording each in the actions log with the rule
that fired and the outcome; then alert. Runs only on the leader controller.

Safety: decisions become `pending` actions first; a pending drain for a node blocks new drain
decisions for it, so a drain that waits for slurmctld to come back is executed exactly once.
Job requeues are actions in the same pipeline (a drain's follow-up `requeue_jobs` lists the
node's babysat jobs and queues one `requeue` per job), retried with backoff while Slurm is
unavailable.

Fault isolation: every decision, action, job and alert is handled in its own error boundary;
an exception is recorded on that item (action outcome, job history, log, metrics) and the rest
of the tick goes on. Work that touches job-owned files runs with a time limit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from babysitter.config import Config
from babysitter.controller.alerts import Alert, AlertRouter
from babysitter.controller.alerts.router import sinks_from_config
from babysitter.controller.alerts.sender import AlertSender
from babysitter.controller.guard_api import GUARD_INFO_KEY, GUARD_KEY
from babysitter.controller.jobs import REQUEUE_RULE, JobTracker
from babysitter.controller.metrics import ControllerMetrics
from babysitter.controller.policy import (
    HEALTHCHECK_MARK,
    JOB_ALERT_PREFIX,
    ClusterFacts,
    Decision,
    NodeFacts,
    PolicyResult,
    PolicySettings,
    decide,
    drain_limit,
)
from babysitter.controller.store import Store, aware
from babysitter.controller.stragglers import (
    CONDITION,
    NodePerf,
    StragglerSettings,
    Streak,
    evaluate,
    perf_from_metrics,
)
from babysitter.controller.validation import Validator, summarise
from babysitter.finding import Action, Finding, Severity
from babysitter.slurm.client import (
    SlurmClient,
    SlurmError,
    SlurmNode,
    SlurmNotFound,
    SlurmNotOwned,
    SlurmUnavailable,
)

log = logging.getLogger(__name__)
ITEM_TIMEOUT_S = 30.0  # one job's work (checkpoint scan, heartbeat read) at most this long
T = TypeVar("T")


def make_engine(
    cfg: Config,
    store: Store,
    metrics: ControllerMetrics | None = None,
    slurm: SlurmClient | None = None,
) -> RemediationEngine:
    return RemediationEngine(cfg, store, metrics or ControllerMetrics(), slurm)


class RemediationEngine:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        metrics: ControllerMetrics,
        slurm: SlurmClient | None = None,
    ) -> None:
        from babysitter.slurm.factory import make_client

        self.cfg = cfg
        self.store = store
        self.metrics = metrics
        self.slurm = slurm or make_client(cfg)
        self.settings = PolicySettings.from_config(cfg)
        self.sender = AlertSender(
            cfg.alerts.queue_size,
            on_sent=lambda sink, state: metrics.alerts.labels(sink, state).inc(),
            on_drop=metrics.alerts_dropped.inc,
        )
        self.router = AlertRouter(
            sinks_from_config(cfg),
            store,
            repeat_interval=timedelta(seconds=cfg.alerts.repeat_interval_s),
            group_threshold=cfg.alerts.group_threshold,
            sender=self.sender,
        )
        self._workers = 4
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="bounded-item")
        self._inflight: dict[str, Future[Any]] = {}
        self._inflight_lock = threading.Lock()
        self.jobs = JobTracker(
            cfg, store, self.slurm, metrics, self.router, self.bounded, ITEM_TIMEOUT_S
        )
        self.slurm_nodes: dict[str, SlurmNode] = {}
        self.slurm_ok = False
        # the node snapshot is re-read every slurm.node_refresh_s, or at once after a change
        self._slurm_read_at = 0.0
        self._slurm_stale = True
        self._batch: list[tuple[dict[str, Any], Decision]] = []  # this tick's real drains/resumes
        self._job_listing: list[Any] | None = None  # shared by this tick's requeue_jobs actions
        self._written: dict[str, dict[str, Any]] = {}  # node columns last written by tick()
        self._perfs: list[NodePerf] = []
        self._straggler_streaks: dict[str, Streak] = {}
        self.straggler_settings = StragglerSettings.from_config(cfg)
        self.validator = Validator(cfg, store, self.slurm)
        self._guard_written: dict[str, Any] | None = None

    # ---- error boundaries
    def bounded(self, fn: Callable[[], T], timeout_s: float, key: str | None = None) -> T:
        """Run fn on a worker thread with a time limit. A call that overruns keeps its thread
        (Python cannot kill it) but the loop moves on and the item records the time-out; the
        same item (key) is not started again while its last call still runs, and with every
        worker stuck new items fail at once instead of each waiting out its limit."""
        with self._inflight_lock:
            self._inflight = {k: f for k, f in self._inflight.items() if not f.done()}
            if key is not None and key in self._inflight:
                raise TimeoutError("its previous run is still stuck")
            if len(self._inflight) >= self._workers:
                raise TimeoutError(f"all {self._workers} workers are stuck in other items")
            fut = self._pool.submit(fn)
            self._inflight[key or f"anon-{id(fut)}"] = fut
        try:
            return fut.result(timeout=timeout_s)
        except FutureTimeout:
            raise TimeoutError(f"gave up after {timeout_s:.0f} s") from None

    def _isolated(
        self,
        item: str,
        fn: Callable[[], Any],
        on_error: Callable[[BaseException], None] | None = None,
    ) -> Any:
        try:
            return fn()
        except Exception as exc:
            log.exception("%s failed", item)
            self.metrics.loop_errors.labels(item.split(" ", 1)[0]).inc()
            if on_error is not None:
                try:
                    on_error(exc)
                except Exception:
                    log.exception("cannot record the failure of %s", item)
            return None

    def close(self) -> None:
        self.sender.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- facts
    def _read_slurm(self, force: bool = False) -> bool:
        """One snapshot of every Slurm node, shared by every decision of the tick. At 10,000
        nodes each read costs slurmctld ~20 ms of CPU (bench/slurm_load.py), so it is re-read
        at a bounded rate; ownership is re-checked by the drain/resume call itself."""
        fresh = time.monotonic() - self._slurm_read_at < self.cfg.slurm.node_refresh_s
        if self.slurm_ok and fresh and not self._slurm_stale and not force:
            return False
        try:
            self.slurm_nodes = {n.name: n for n in self.slurm.nodes()}
            self.slurm_ok = True
            self._slurm_read_at = time.monotonic()
            self._slurm_stale = False
        except SlurmError as exc:
            if self.slurm_ok:
                log.warning("Slurm unavailable, decisions will wait: %s", exc)
            self.slurm_ok = False
        return True

    def facts(self, now: datetime) -> tuple[list[NodeFacts], ClusterFacts]:
        rows = self.store.node_rows()
        self._perfs = [
            perf
            for r in rows
            if (perf := perf_from_metrics(r["name"], r.get("metrics"))) is not None
        ]
        actions = self.store.actions(limit=5000)
        pending_drains = {
            a["node"] for a in actions if a["status"] == "pending" and a["kind"] == "drain"
        }
        drains_by_node: dict[str, list[datetime]] = {}
        drains_last_hour = 0
        for a in actions:
            if a["kind"] == "drain" and a["status"] == "done" and a["requested_by"] == "policy":
                when = a["done_at"] or a["created_at"]
                drains_by_node.setdefault(a["node"], []).append(when)
                if now - when <= timedelta(hours=1):
                    drains_last_hour += 1
        xids: dict[str, list[tuple[str, int, datetime]]] = {}
        for f in self.store.findings(
            since=now - timedelta(hours=24), severity=Severity.CRITICAL, limit=10_000
        ):
            code = str(f["code"])
            if code.startswith("xid.") and code[4:].isascii() and code[4:].isdigit():
                xids.setdefault(f["node"], []).append(
                    (f["component"], int(code[4:12]), f["observed_at"])
                )
        validations = summarise(actions)
        prefix = self.cfg.slurm.reason_prefix
        own_check_mark = f"{prefix} {HEALTHCHECK_MARK}"
        facts: list[NodeFacts] = []
        partitions: dict[str, int] = {}
        drained_by_us: dict[str, int] = {}
        for known in self.slurm_nodes.values():
            for p in known.partitions or ("default",):
                partitions[p] = partitions.get(p, 0) + 1
                if known.drained_or_draining and known.reason.startswith(prefix):
                    drained_by_us[p] = drained_by_us.get(p, 0) + 1
        for r in rows:
            sn = self.slurm_nodes.get(r["name"])
            last = r["last_report_at"]
            age = None if last is None else (now - last).total_seconds()
            dry_drained = self.settings.dry_run and bool(r["babysitter_drained"])
            if sn is not None:
                drained = sn.drained_or_draining or sn.down
                reason = sn.reason
                # a HealthCheckProgram drain (`check --slurm-drain`) is the check's to resume
                ours = (
                    reason.startswith(prefix) and not reason.startswith(own_check_mark)
                ) or dry_drained
                parts = sn.partitions or ("default",)
            else:  # Slurm unreadable: last known state
                drained = bool(r["babysitter_drained"]) or bool(r.get("slurm_reason"))
                reason = r.get("slurm_reason") or ""
                ours = bool(r["babysitter_drained"])
                parts = ("default",)
            if dry_drained:
                drained = True
                for p in parts:
                    drained_by_us[p] = drained_by_us.get(p, 0) + 1
            facts.append(
                NodeFacts(
                    name=r["name"],
                    open_findings=tuple(r["open_findings"]),
                    consecutive_clean=r["consecutive_clean"] or 0,
                    heartbeat_age_s=age,
                    partitions=tuple(parts),
                    drained=drained,
                    reason=reason,
                    ours=ours,
                    in_slurm=sn is not None or not self.slurm_ok,
                    drain_pending=r["name"] in pending_drains,
                    recent_drains=tuple(drains_by_node.get(r["name"], [])),
                    xid_history=tuple(xids.get(r["name"], [])),
                    validation=validations[r["name"]].state if r["name"] in validations else "",
                    validation_failures=(
                        validations[r["name"]].failures if r["name"] in validations else 0
                    ),
                )
            )
        cluster = ClusterFacts(
            partition_sizes=partitions,
            drained_by_us=drained_by_us,
            drains_last_hour=drains_last_hour,
            guard_tripped=bool(self.store.kv_get(GUARD_KEY, False)),
        )
        return facts, cluster

    # ---- the loop body
    def tick(self, now: datetime | None = None) -> list[Decision]:
        now = now or datetime.now(UTC)
        read = self._read_slurm()
        facts, cluster = self.facts(now)
        slow = self._isolated("stragglers", lambda: self._stragglers(facts, now))
        if slow is not None:
            facts = slow[0]
        result = decide(facts, cluster, self.settings, now)
        # actions recorded during this tick (follow-ups, admin requests) run from the next one
        pending = self.store.pending_actions()
        due = any(not ((nxt := aware(a["next_attempt_at"])) and nxt > now) for a in pending)
        if due and not read:
            # actions are due: they must not run against a slurmctld that went away since the
            # snapshot (only while there is work, so the steady state keeps its budget)
            self._read_slurm(force=True)
        firing: list[Alert] = []
        clearing: list[tuple[str | None, str]] = []
        self._batch = []
        for d in slow[1] if slow is not None else []:
            if d.kind == "alert" and d.node:
                firing.append(
                    Alert(
                        d.node,
                        d.condition,
                        d.severity,
                        d.reason,
                        "nothing changed in Slurm",
                        now,
                        details=d.details,
                    )
                )
            elif d.kind == "resolve_alert":
                clearing.append((d.node, d.condition))
        for d in result.decisions:
            self._isolated(
                f"decision {d.kind} {d.node or ''}",
                lambda d=d: self._apply(d, cluster, now, firing, clearing),  # type: ignore[misc]
            )
        self._isolated("batch", lambda: self._execute_batch(now, firing, clearing))
        self._run_pending(pending, now)
        if self.validator.enabled:
            self._isolated("validation", lambda: self.validator.poll(now, firing, clearing))
        self._isolated("verdicts", lambda: self._write_verdicts(result, facts))
        self._isolated("guard", lambda: self._write_guard(result, cluster, now))
        if not result.guard_tripped:
            clearing.append((None, "guard_tripped"))
        self._isolated("alerts", lambda: self._alert(firing, clearing, now))
        self._isolated("jobs", lambda: self.jobs.tick(self.slurm_nodes, now))
        return result.decisions

    def _stragglers(
        self, facts: list[NodeFacts], now: datetime
    ) -> tuple[list[NodeFacts], list[Decision]]:
        """Compare each node's throughput with its GPU model's fleet median (pure policy in
        controller/stragglers.py). A straggler the site wants drained becomes a drain-worthy
        finding of the node, so the blast-radius guard applies to it like to any other."""
        res = evaluate(self._perfs, self._straggler_streaks, self.straggler_settings)
        self._straggler_streaks = res.streaks
        drains = {d.node: d for d in res.decisions if d.kind == "drain" and d.node}
        if drains:
            facts = [
                replace(
                    f,
                    open_findings=(
                        *f.open_findings,
                        Finding(
                            check="stragglers",
                            component="host",
                            severity=Severity.WARNING,
                            code=CONDITION,
                            action=Action.DRAIN,
                            message=drains[f.name].reason,
                            observed_at=now,
                        ),
                    ),
                )
                if f.name in drains
                else f
                for f in facts
            ]
        alerts = [
            Decision(
                "alert", d.node, d.rule, d.reason, Severity.WARNING, CONDITION, details=d.details
            )
            if d.kind == "drain"
            else d
            for d in res.decisions
        ]
        return facts, alerts

    def _apply(
        self,
        d: Decision,
        cluster: ClusterFacts,
        now: datetime,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
    ) -> None:
        if d.kind in ("drain", "resume"):
            aid = self.store.record_action(
                d.kind,
                node=d.node,
                reason=d.reason,
                rule=d.rule,
                requested_by="policy",
                dry_run=d.dry_run,
            )
            action = {
                "id": aid,
                "kind": d.kind,
                "node": d.node,
                "job_id": None,
                "reason": d.reason,
                "rule": d.rule,
                "requested_by": "policy",
                "dry_run": d.dry_run,
                "attempts": 0,
            }
            if not d.dry_run and self.slurm_ok and d.node:
                self._batch.append((action, d))  # executed batched after every decision
                return
            self._node_alert(d, self._execute(action, now), firing, clearing, now)
        elif d.kind == "guard_tripped":
            if not cluster.guard_tripped:
                self.store.kv_set(GUARD_KEY, True)
                self.store.record_action(
                    "guard",
                    reason=d.reason,
                    rule=d.rule,
                    requested_by="policy",
                    status="done",
                    outcome="breaker tripped: drains stopped",
                )
            firing.append(
                Alert(
                    None,
                    "guard_tripped",
                    Severity.CRITICAL,
                    d.reason,
                    "stopped draining (resumes still allowed)",
                    now,
                    details=d.details,
                )
            )
        elif d.kind == "keep_alert":
            held = {
                "node_unhealthy": "node held drained by babysitter until clean checks",
                "guard_tripped": "stopped draining (resumes still allowed)",
            }
            firing.append(
                Alert(d.node, d.condition, d.severity, d.reason, held.get(d.condition, ""), now)
            )
        elif d.kind in ("alert", "escalate"):
            firing.append(
                Alert(d.node, d.condition, d.severity, d.reason, "nothing changed in Slurm", now)
            )
        elif d.kind == "resolve_alert":
            clearing.append((d.node, d.condition))
        elif d.kind == "validate" and d.node:
            if d.dry_run:
                self.store.record_action(
                    "validate",
                    node=d.node,
                    reason=d.reason,
                    rule=d.rule,
                    status="done",
                    outcome="dry-run: no validation job",
                    dry_run=True,
                )
            else:
                self.validator.start(d.node, d.reason, now)

    def _alert(
        self, firing: list[Alert], clearing: list[tuple[str | None, str]], now: datetime
    ) -> None:
        # conditions the policy asserts every tick while they hold (job-owned findings,
        # escalations): resolve the ones not asserted this tick
        asserted = {a.key for a in firing}
        for key in self.router.firing_keys():
            node, _, cond = key.partition("|")
            per_tick = cond.startswith((JOB_ALERT_PREFIX, "xid_")) or cond == "lemon_node"
            if per_tick and key not in asserted:
                clearing.append((None if node == "cluster" else node, cond))
        self.router.process(firing, clearing, now)

    def _write_verdicts(self, result: PolicyResult, facts: list[NodeFacts]) -> None:
        changes: dict[str, dict[str, Any]] = {}
        facts_by_name = {f.name: f for f in facts}
        for name, verdict in result.verdicts.items():
            sn = self.slurm_nodes.get(name)
            running = facts_by_name.get(name)
            if running is not None and running.validation == "running":
                verdict = "validating"
            values: dict[str, Any] = {"verdict": verdict}
            if sn is not None:
                values["slurm_state"] = "+".join([sn.state, *sorted(sn.flags)])
                values["slurm_reason"] = sn.reason or None
            old = self._written.get(name)
            if old != values:
                changes[name] = values
        if changes:
            self.store.update_nodes(changes)
            self._written.update(changes)

    def _write_guard(self, result: PolicyResult, cluster: ClusterFacts, now: datetime) -> None:
        """The guard's state and why, for `babysitter status` and GET /api/v1/guard."""
        prev = self.store.kv_get(GUARD_INFO_KEY) or {}
        trip = next((d for d in result.decisions if d.kind == "guard_tripped"), None)
        unsized = next((d for d in result.decisions if d.rule == "guard_unknown"), None)
        tripped = bool(result.guard_tripped)
        if tripped and prev.get("tripped"):
            rule, reason, since = prev.get("rule"), prev.get("reason"), prev.get("since")
            if trip is not None:
                reason = trip.reason
        elif tripped:
            rule = trip.rule if trip else "guard_tripped"
            reason = trip.reason if trip else "breaker tripped earlier; needs an admin reset"
            since = now.isoformat()
        else:
            rule, reason, since = "", "", None
        s = self.settings
        info: dict[str, Any] = {
            "tripped": tripped,
            "rule": rule,
            "reason": reason,
            "since": since,
            "blocked": _names(trip.details.get("blocked") if trip else None),
            "slurm_data": bool(cluster.partition_sizes),
            "undecided": _names(unsized.details.get("blocked") if unsized else None),
            "undecided_reason": unsized.reason if unsized else "",
            "limits": {
                "max_drained_fraction": s.max_drained_fraction,
                "min_drainable": s.min_drainable,
                "max_drains_per_hour": s.max_drains_per_hour,
            },
            "drains_last_hour": cluster.drains_last_hour,
            "partitions": {
                p: {
                    "size": n,
                    "drained_by_babysitter": cluster.drained_by_us.get(p, 0),
                    "may_drain": int(drain_limit(n, s)),
                }
                for p, n in sorted(cluster.partition_sizes.items())
            },
        }
        if info != self._guard_written:
            self.store.kv_set(GUARD_INFO_KEY, info)
            self._guard_written = info

    # ---- execution
    @staticmethod
    def _node_alert(
        d: Decision,
        outcome: str,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
        now: datetime,
    ) -> None:
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

    def _execute_batch(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        """The tick's drains and resumes: one Slurm call per (kind, reason) group, each of
        which re-checks ownership of exactly its nodes first (a rack of 32 nodes failing
        alike is one lookup and one `scontrol update NodeName=a,b,...`)."""
        batch, self._batch = self._batch, []
        groups: dict[tuple[str, str], list[tuple[dict[str, Any], Decision]]] = {}
        for a, d in batch:
            key = (d.kind, d.reason if d.kind == "drain" else "")
            groups.setdefault(key, []).append((a, d))
        if batch:
            self._slurm_stale = True
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
                outcome = self._isolated(
                    f"action {kind} {d.node}", partial(self._settle, a, err, now)
                )
                self._node_alert(d, outcome or "failed", firing, clearing, now)

    def _settle(self, a: dict[str, Any], err: SlurmError | None, now: datetime) -> str:
        """Record the outcome of a batched drain/resume of one node; returns its status."""
        aid, kind, node, reason = a["id"], a["kind"], a["node"], a.get("reason") or ""
        if isinstance(err, SlurmUnavailable):
            self.slurm_ok = False
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

    def _run_pending(self, pending: list[dict[str, Any]], now: datetime) -> None:
        due = [a for a in pending if not ((nxt := aware(a["next_attempt_at"])) and nxt > now)]
        # every node drained in one tick: one job listing for all of their requeue_jobs
        nodes = [a["node"] for a in due if a["kind"] == "requeue_jobs" and a["node"]]
        self._job_listing = None
        if nodes and self.slurm_ok:
            try:
                self._job_listing = self.slurm.jobs_on(nodes)
            except SlurmError:
                pass  # each action asks (and retries) on its own
        try:
            for a in due:
                self._execute(a, now)
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

    def _execute(self, a: dict[str, Any], now: datetime) -> str:
        """Run one action in its own error boundary; returns its new status."""
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
        if not dry_run and not self.slurm_ok and kind != "guard_reset":
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
            self._slurm_stale = True
        try:
            if kind == "drain" and node:
                self.slurm.drain(node, reason)
                self.store.set_node(
                    node, babysitter_drained=True, drain_reason=reason, drained_at=now
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
                    ITEM_TIMEOUT_S,
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
            self.slurm_ok = False
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


def _names(value: object) -> list[str]:
    """The node names a decision's details carry (a list of str), or []."""
    return [str(v) for v in value] if isinstance(value, list) else []
