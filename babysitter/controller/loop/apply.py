"""Applying the policy's decisions: a drain or resume becomes a pending action and goes to the
executor (batched: one Slurm call for the tick's moves), a tripped guard is recorded once and
pages, an alert decision joins the tick's alerts, a validation decision starts a validation job.
The tick (remediation.py) hands every decision here; nothing else turns a decision into a change."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from babysitter.controller.db import audit
from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import record_actions
from babysitter.controller.loop.act.executor import ActionExecutor, node_alert
from babysitter.controller.loop.decide.node.decisions import Decision, DecisionKind
from babysitter.controller.loop.decide.node.facts_model import ClusterFacts
from babysitter.controller.loop.heal.validation import Validator
from babysitter.controller.loop.read.guard import GUARD_KEY
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Severity


class DecisionApplier:
    def __init__(
        self,
        store: Store,
        executor: ActionExecutor,
        validator: Validator,
        slurm_ok: Callable[[], bool],
    ) -> None:
        self.store = store
        self.executor = executor
        self.validator = validator
        self.slurm_ok = slurm_ok

    def record_moves(
        self, decisions: list[Decision], cluster: ClusterFacts, now: datetime
    ) -> dict[int, Action]:
        """Pending actions of the tick's drain/resume decisions, and the record of the breaker
        tripping in this tick, in one statement: id(decision) -> action."""
        moves = [d for d in decisions if d.kind in (DecisionKind.DRAIN, DecisionKind.RESUME)]
        trip = DecisionKind.GUARD_TRIPPED
        trips = [] if cluster.guard_tripped else [d for d in decisions if d.kind is trip]
        if not moves and not trips:
            return {}
        done = [self._trip_record(d) for d in trips]
        recorded = record_actions(self.store, [self._action_of(d) for d in moves], now, done)
        return dict(zip(map(id, moves + trips), recorded, strict=True))

    @staticmethod
    def _trip_record(d: Decision) -> Action:
        """The actions log's record of the breaker tripping."""
        return Action(
            ActionKind.GUARD,
            reason=d.reason,
            rule=d.rule or None,
            requested_by="policy",
            status=ActionStatus.DONE,
            outcome="breaker tripped: drains stopped",
        )

    @staticmethod
    def _action_of(d: Decision) -> Action:
        """The pending action of a drain/resume decision."""
        return Action(
            ActionKind(d.kind), node=d.node, reason=d.reason, rule=d.rule, dry_run=d.dry_run
        )

    def apply(
        self,
        d: Decision,
        cluster: ClusterFacts,
        now: datetime,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
        action: Action | None = None,
    ) -> None:
        """Carry out one decision: a drain/resume through the executor, the rest as alerts,
        the breaker or a validation job."""
        if d.kind in (DecisionKind.DRAIN, DecisionKind.RESUME):
            self._move(d, now, firing, clearing, action)
        elif d.kind is DecisionKind.GUARD_TRIPPED:
            self._trip_guard(d, cluster, now, firing, action)
        elif d.kind is DecisionKind.KEEP_ALERT:
            held = {
                "node_unhealthy": "node held drained by babysitter until clean checks",
                "guard_tripped": "stopped draining (resumes still allowed)",
            }
            firing.append(
                Alert(d.node, d.condition, d.severity, d.reason, held.get(d.condition, ""), now)
            )
        elif d.kind in (DecisionKind.ALERT, DecisionKind.ESCALATE):
            firing.append(
                Alert(
                    d.node,
                    d.condition,
                    d.severity,
                    d.reason,
                    "nothing changed in Slurm",
                    now,
                    nodes=list(d.nodes),
                )
            )
        elif d.kind is DecisionKind.RESOLVE_ALERT:
            clearing.append((d.node, d.condition))
        elif d.kind is DecisionKind.VALIDATE and d.node:
            self._validate(d, now)

    def _move(
        self,
        d: Decision,
        now: datetime,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
        action: Action | None,
    ) -> None:
        """A drain/resume: batched after every decision when it goes to Slurm, else (dry run,
        Slurm away) executed now, which records or reschedules it."""
        if action is None:
            action = self.store.record(self._action_of(d))
        if not d.dry_run and self.slurm_ok() and d.node:
            self.executor.batch.append((action, d))
            return
        node_alert(d, self.executor.execute(action, now), firing, clearing, now)

    def _trip_guard(
        self,
        d: Decision,
        cluster: ClusterFacts,
        now: datetime,
        firing: list[Alert],
        record: Action | None,
    ) -> None:
        """The blast-radius breaker trips (recorded once, when it trips) and pages."""
        if not cluster.guard_tripped:
            self.store.kv_set(GUARD_KEY, True)
            if record is None:  # not recorded with the tick's moves
                record = self.store.record(self._trip_record(d))
            audit.record_actions(self.store, [record.id], now)
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

    def _validate(self, d: Decision, now: datetime) -> None:
        """A validation job before the node returns (a dry run records only that it would)."""
        assert d.node is not None
        if not d.dry_run:
            self.validator.start(d.node, d.reason, now)
            return
        vid = self.store.record_action(
            ActionKind.VALIDATE,
            node=d.node,
            reason=d.reason,
            rule=d.rule or None,
            status=ActionStatus.DONE,
            outcome="dry-run: no validation job",
            dry_run=True,
        )
        audit.record_actions(self.store, [vid], now)
