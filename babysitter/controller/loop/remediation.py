"""The remediation engine: every tick, gather facts (store + Slurm), run the pure policy, and
execute its decisions through the Slurm client, recording each in the actions log with the rule
that fired and the outcome; then alert. Runs only on the leader controller.

This module runs the tick and applies the decisions; its collaborators (controller/loop/) each
do one job: the Slurm node snapshot (snapshot.py), the facts the policy reads (facts.py), the
execution of recorded actions through Slurm (executor.py), the verdicts and guard state written
for readers (outcome.py), the jobs (jobs.py, nccl_requeue.py) and the alerts (alerts/).

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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from babysitter.config import Config
from babysitter.controller.db.store import Store
from babysitter.controller.loop.act.executor import ActionExecutor
from babysitter.controller.loop.admit.admission import Admission
from babysitter.controller.loop.admit.maintenance import Alertmanager, Maintenance
from babysitter.controller.loop.apply import DecisionApplier
from babysitter.controller.loop.decide.node.decisions import Decision, DecisionKind, PolicyResult
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.node.job_alerts import JOB_ALERT_PREFIX
from babysitter.controller.loop.decide.node.policy import decide
from babysitter.controller.loop.fabric.fabric_loop import FabricStep
from babysitter.controller.loop.fabric.nvlink_domain import DomainStep
from babysitter.controller.loop.heal.healer import Healer
from babysitter.controller.loop.heal.rma import RmaEvidence
from babysitter.controller.loop.heal.validation import Validator
from babysitter.controller.loop.jobs.jobs import JobTracker
from babysitter.controller.loop.jobs.nccl_requeue import NcclRequeues
from babysitter.controller.loop.read.context import LoopContext
from babysitter.controller.loop.read.facts import FactGatherer
from babysitter.controller.loop.read.snapshot import SlurmSnapshot
from babysitter.controller.loop.reconfigure import CONDITION as RELOAD_FAILED
from babysitter.controller.loop.reconfigure import reconfigure, reload_alert
from babysitter.controller.loop.record.alerts import Alert, AlertRouter
from babysitter.controller.loop.record.alerts.router import sinks_from_config
from babysitter.controller.loop.record.alerts.sender import AlertSender
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.controller.loop.record.outcome import OutcomeWriter
from babysitter.controller.loop.sdc.schedule import SdcScheduler
from babysitter.slurm.client import SlurmClient, SlurmNode

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
        self._workers = 4
        self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="bounded-item")
        self._inflight: dict[str, Future[Any]] = {}
        self._inflight_lock = threading.Lock()
        self._quiet: set[str] = set()  # nodes in an open maintenance window, this tick
        # the last refused config reload (its error, since when): alerts until a good one
        self.config_problem: tuple[str, datetime] | None = None
        self._alerting(cfg, metrics)
        self._acting(cfg, metrics)
        self._steps(cfg, metrics)

    def _alerting(self, cfg: Config, metrics: ControllerMetrics) -> None:
        self.sender = AlertSender(
            cfg.alerts.queue_size,
            on_sent=lambda sink, state: metrics.alerts.labels(sink, state).inc(),
            on_drop=metrics.alerts_dropped.inc,
        )
        self.router = AlertRouter(
            sinks_from_config(cfg),
            self.store,
            repeat_interval=timedelta(seconds=cfg.alerts.repeat_interval_s),
            group_threshold=cfg.alerts.group_threshold,
            sender=self.sender,
            on_record_error=metrics.alert_record_errors.inc,
        )

    def _acting(self, cfg: Config, metrics: ControllerMetrics) -> None:
        """The executor and what it works with: the jobs, the node snapshot, admission."""
        store = self.store
        self.jobs = JobTracker(
            cfg, store, self.slurm, metrics, self.router, self.bounded, ITEM_TIMEOUT_S
        )
        self.nccl = NcclRequeues(self.jobs)  # a babysat job's own NCCL network failure
        self.snapshot = SlurmSnapshot(cfg, self.slurm)
        # every automatic action is asked here right before it is carried out (admission.py)
        self.admission = Admission(
            cfg, store, self.slurm, self.snapshot, metrics, lambda: self.fabric.topology_known
        )
        self.executor = ActionExecutor(
            store,
            self.slurm,
            self.snapshot,
            self.jobs,
            metrics,
            self.bounded,
            self._isolated,
            ITEM_TIMEOUT_S,
            self.admission,
        )

    def _steps(self, cfg: Config, metrics: ControllerMetrics) -> None:
        """The tick's steps: facts, outcome, validation, fabric, domains, healer, maintenance,
        SDC, RMA evidence."""
        store = self.store
        self.gatherer = FactGatherer(
            cfg, store, self.settings, self.snapshot, self.router, self._isolated
        )
        self.outcome = OutcomeWriter(store, self.settings, self.snapshot)
        self.executor.node_columns = self.outcome  # a moved node's row: written once a tick
        self.validator = Validator(cfg, store, self.slurm)
        self.validator.admission = self.admission
        self.applier = DecisionApplier(store, self.executor, self.validator, lambda: self.slurm_ok)
        ctx = LoopContext(cfg, store, self.slurm, self.snapshot)
        self.fabric = FabricStep(
            ctx, self.jobs, metrics, self.settings, self._isolated, self.admission
        )
        # NVLink domains (NVL72 racks): the same correlation with the domain as the scope
        self.domains = DomainStep(ctx, self.settings, self.admission, metrics.registry)
        self.admission.domains = lambda: self.domains.membership  # the domain caps
        self.healer = Healer(ctx, self.validator, self.settings.dry_run)
        self.healer.admission = self.admission
        am = cfg.alerts.alertmanager_url
        self.maintenance = Maintenance(
            store,
            self.slurm,
            Alertmanager(am) if am else None,
            cfg.controller.maintenance_reservation_user,
        )
        self.sdc = SdcScheduler(ctx)
        self.rma = RmaEvidence(cfg, store)  # lemons' and failed rungs' evidence archives

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

    def config_reloaded(self, error: str | None) -> None:
        """A configuration reload was applied (error None: refresh what was copied at start)
        or refused (the config_reload_failed alert fires until a reload succeeds)."""
        if error is None:
            reconfigure(self)
            self.config_problem = None
        elif self.config_problem is None or self.config_problem[0] != error:
            self.config_problem = (error, datetime.now(UTC))

    def close(self) -> None:
        self.sender.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.snapshot.close()
        self.fabric.close()

    def _maintenance(self, now: datetime) -> set[str]:
        """Close the windows past their deadline; the nodes still in one."""
        return {n for w in self.maintenance.expire(now) for n in w.nodes}

    # ---- the collaborators' state, under the names the rest of the code knows
    @property
    def slurm_nodes(self) -> dict[str, SlurmNode]:
        return self.snapshot.nodes

    @property
    def slurm_ok(self) -> bool:
        return self.snapshot.ok

    def _read_slurm(self, force: bool = False) -> bool:
        return self.snapshot.read(force)

    def facts(self, now: datetime) -> tuple[list[NodeFacts], ClusterFacts]:
        return self.gatherer.gather(now)

    # ---- the loop body
    def tick(self, now: datetime | None = None) -> list[Decision]:
        with self.store.tick_reads():  # each table read once unless written (db/tick_reads.py)
            return self._tick(now or datetime.now(UTC))

    def _tick(self, now: datetime) -> list[Decision]:
        read = self._read_slurm()
        quiet = self._isolated("maintenance", lambda: self._maintenance(now))
        self._quiet = self.maintenance.quiet_now(quiet)  # unreadable: the last known set
        self.healer.maintenance_known = self.maintenance.known  # the healer holds and says so
        # windows that could not be read: no new automatic action anywhere (unknown, not none)
        self.admission.quiet = quiet
        facts, cluster, result, noticed = self._decide(now)
        self._isolated("nccl requeues", lambda: self.nccl.step(facts, now))  # run by _act
        firing, clearing = self._straggler_alerts(noticed, now)
        self.outcome.prepare(result, facts)
        self._act(result, cluster, now, firing, clearing, read)
        self._publish(result, facts, cluster, now, firing, clearing)
        self._isolated("jobs", lambda: self.jobs.tick(self.slurm_nodes, now))
        self._isolated("sdc", lambda: self.sdc.tick(now))
        return result.decisions

    def _decide(
        self, now: datetime
    ) -> tuple[list[NodeFacts], ClusterFacts, PolicyResult, list[Decision]]:
        """The facts (stragglers folded in) and the policy's decisions on them; also the
        straggler decisions, which only alert."""
        facts, cluster = self.facts(now)
        if self._quiet:
            # nodes in maintenance are not the policy's: no drain, no page, and their faults
            # do not count towards the blast-radius guard (an admin is working on them)
            facts = [f for f in facts if f.name not in self._quiet]
        slow = self._isolated("stragglers", lambda: self.gatherer.with_stragglers(facts, now))
        if slow is not None:
            facts = slow[0]
        # switch incidents answer for their nodes' fabric findings; the caps gate new drains
        hooked = self._isolated("fabric", lambda: self.fabric.before_policy(facts, cluster, now))
        admit: Callable[[NodeFacts], bool] | None = None
        if hooked is not None:
            facts, cluster, admit = hooked
        # a failed domain correlation hides nothing: each node's fabric fault is its own
        domained = self._isolated("nvlink domains", lambda: self.domains.before_policy(facts, now))
        if domained is not None:
            facts = domained
        else:
            # a failed correlation leaves the caps on: the gate alone, or no new drain at all
            gate = self._isolated("caps", lambda: (self.fabric.caps_gate(),))
            admit = gate[0] if gate is not None else (lambda n: False)
        result = decide(facts, cluster, self.settings, now, admit)
        if hooked is not None:
            self._isolated("fabric", lambda: self.fabric.true_verdicts(result))
        if domained is not None:
            self._isolated("nvlink domains", lambda: self.domains.true_verdicts(result))
        result.decisions = self.healer.hold(result.decisions, now)  # open remediations own theirs
        return facts, cluster, result, slow[1] if slow is not None else []

    @staticmethod
    def _straggler_alerts(
        noticed: list[Decision], now: datetime
    ) -> tuple[list[Alert], list[tuple[str | None, str]]]:
        """The tick's alerts to fire and to clear, starting with the stragglers'."""
        firing: list[Alert] = []
        clearing: list[tuple[str | None, str]] = []
        for d in noticed:
            if d.kind is DecisionKind.ALERT and d.node:
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
            elif d.kind is DecisionKind.RESOLVE_ALERT:
                clearing.append((d.node, d.condition))
        return firing, clearing

    def _act(
        self,
        result: PolicyResult,
        cluster: ClusterFacts,
        now: datetime,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
        read: bool,
    ) -> None:
        """Record and apply the decisions, execute the drains/resumes batched, then the due
        pending actions, and poll the validation jobs. `read`: this tick took up a snapshot."""
        # actions recorded during this tick (follow-ups, admin requests) run from the next one
        pending = self.store.pending_actions()
        due = any(not ((nxt := a.next_attempt_at) and nxt > now) for a in pending)
        if due and not read:
            # actions are due: they must not run against a slurmctld that went away since the
            # snapshot (only while there is work, so the steady state keeps its budget)
            self._read_slurm(force=True)
        self.executor.batch = []
        # the tick's drains/resumes (and a breaker tripping) are recorded in one statement (a
        # rack: one, not 32)
        recorded = self._isolated(
            "record actions", lambda: self.applier.record_moves(result.decisions, cluster, now)
        )
        for d in result.decisions:
            self._isolated(
                f"decision {d.kind} {d.node or ''}",
                lambda d=d: self.applier.apply(  # type: ignore[misc]
                    d, cluster, now, firing, clearing, (recorded or {}).get(id(d))
                ),
            )
        self._isolated("batch", lambda: self.executor.execute_batch(now, firing, clearing))
        self._isolated("fabric", lambda: self.fabric.act(now, firing, clearing))
        self._isolated("nvlink domains", lambda: self.domains.act(now, firing, clearing))
        self.executor.run_pending(pending, now)
        if self.validator.enabled or self.healer.enabled:
            self._isolated("validation", lambda: self.validator.poll(now, firing, clearing))
        self.healer.quiet = self._quiet
        self._isolated("healer", lambda: self.healer.step(now, firing, clearing))
        self._isolated("rma evidence", lambda: self.rma.step(now, firing, clearing))
        self._isolated("admission", lambda: self.admission.alerts(now, firing, clearing))

    def _publish(
        self,
        result: PolicyResult,
        facts: list[NodeFacts],
        cluster: ClusterFacts,
        now: datetime,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
    ) -> None:
        """Write the verdicts and the guard's state, and send the tick's alerts."""
        self._isolated("verdicts", lambda: self.outcome.verdicts(result, facts))
        self._isolated("guard", lambda: self.outcome.guard(result, cluster, now))
        if not result.guard_tripped:
            clearing.append((None, "guard_tripped"))
        if self.config_problem is None:
            clearing.append((None, RELOAD_FAILED))
        else:
            firing.append(reload_alert(*self.config_problem))
        self._isolated("alerts", lambda: self._alert(firing, clearing, now))

    def _alert(
        self, firing: list[Alert], clearing: list[tuple[str | None, str]], now: datetime
    ) -> None:
        # nodes in maintenance are not paged (nor anything about them: job alerts included)
        firing = [a for a in firing if a.node is None or a.node not in self._quiet]
        # conditions the policy asserts every tick while they hold (job-owned findings,
        # escalations): resolve the ones not asserted this tick
        asserted = {a.key for a in firing}
        for key in self.router.firing_keys():
            node, _, cond = key.partition("|")
            per_tick = cond.startswith((JOB_ALERT_PREFIX, "xid_")) or cond == "lemon_node"
            if per_tick and key not in asserted:
                clearing.append((None if node == "cluster" else node, cond))
        self.router.process(firing, clearing, now)
