"""The facts the policy decides on: each node's row (findings, heartbeat, drains, XIDs,
validation) joined with its Slurm state into NodeFacts, for the nodes that may need a decision
plus this tick's share of the rest, the cluster aggregates the guard needs, and the straggler
findings (throughput against the fleet) folded in."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from babysitter.config import Config
from babysitter.controller.db.episodes import validation_history
from babysitter.controller.db.policy_read import policy_rows, policy_view
from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import (
    drains_since,
    pending_drain_nodes,
    perf_metrics,
    policy_drain_times,
)
from babysitter.controller.loop.decide.node.decisions import Decision, DecisionKind
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.stragglers import (
    CONDITION,
    NodePerf,
    StragglerSettings,
    Streak,
    evaluate,
    perf_from_metrics,
)
from babysitter.controller.loop.read.guard import GUARD_KEY
from babysitter.controller.loop.read.snapshot import SlurmSnapshot
from babysitter.controller.loop.record.alerts import AlertRouter
from babysitter.finding import Action, Finding, Severity
from babysitter.slurm.ownership import automatic_reason


class FactGatherer:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        settings: PolicySettings,
        snapshot: SlurmSnapshot,
        router: AlertRouter,
        isolated: Callable[..., Any],
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.settings = settings
        self.snapshot = snapshot
        self.router = router  # its firing alerts: their nodes go to the policy
        self.isolated = isolated  # the engine's per-item error boundary
        self._perfs: list[NodePerf] = []
        self._perf_read_at = float("-inf")
        self._full_pass_done = False  # the first tick passes every node
        self._straggler_streaks: dict[str, Streak] = {}
        self.straggler_settings = StragglerSettings.from_config(cfg)

    def _read_perfs(self) -> None:
        """Throughput measurements (stragglers) change on the slow check tiers: re-read at the
        node snapshot's rate, only the rows that carry one."""
        if time.monotonic() - self._perf_read_at < self.cfg.slurm.node_refresh_s:
            return
        self._perf_read_at = time.monotonic()
        self._perfs = [
            perf
            for name, metrics in perf_metrics(self.store)
            if (perf := perf_from_metrics(name, metrics)) is not None
        ]

    def gather(self, now: datetime) -> tuple[list[NodeFacts], ClusterFacts]:
        """Facts of the nodes that may need a decision (all of them on a full pass: the first
        tick, after a large Slurm change), a share of the rest in turn (every node within
        snapshot.FULL_PASS_S) and the cluster aggregates the guard needs. A node left out is
        healthy, reporting, not drained and already written as healthy: the policy would
        decide nothing for it."""
        self.isolated("perfs", self._read_perfs)
        # every pending drain, counted in the database (a listing of pending actions holds
        # only the newest 1,000): each holds its place in the guard's count
        pending_drains = pending_drain_nodes(self.store, dry_run=None)
        # the lemon count's drains, counted in the database like the rolling hour's below
        drains_by_node = policy_drain_times(self.store, now - self.settings.lemon_window)
        # the drain budget's rolling hour, counted in the database (a listing of the newest
        # actions would miss drains behind thousands of other actions)
        drains_last_hour = drains_since(self.store, now - timedelta(hours=1))
        # each node's validations since babysitter last drained it, counted in the database
        validations = validation_history(self.store)
        since = now - self.settings.xid_window  # the XID escalation's window
        if not self._full_pass_done:
            self._full_pass_done = True
            view = policy_view(self.store, since, full=True)
        else:
            named = (
                self.snapshot.sweep_share()
                | self.snapshot.changed
                | self.snapshot.held
                | pending_drains
                | drains_by_node.keys()
                | validations.keys()
                | self._alerting_nodes()
            )
            stale = now - timedelta(seconds=self.settings.heartbeat_timeout_s)
            # and every node with an XID in the window (named by the read itself)
            view = policy_view(self.store, since, stale_before=stale, names=named)
        self.snapshot.changed = set()
        rows = view.rows
        facts = self._node_facts(rows, now, pending_drains, drains_by_node, view.xids, validations)
        drained_by_us = self._with_pending(dict(self.snapshot.drained_by_us), pending_drains)
        if self.settings.dry_run:  # a dry-run drain holds its place in the guard's count
            for f, r in zip(facts, rows, strict=True):
                if r["babysitter_drained"]:
                    for p in f.partitions:
                        drained_by_us[p] = drained_by_us.get(p, 0) + 1
        cluster = ClusterFacts(
            partition_sizes=dict(self.snapshot.partitions),
            drained_by_us=drained_by_us,
            drains_last_hour=drains_last_hour,
            guard_tripped=bool(self.store.kv_get(GUARD_KEY, False)),
        )
        return facts, cluster

    def _with_pending(self, drained_by_us: dict[str, int], pending: set[str]) -> dict[str, int]:
        """A drain decided but not carried out yet (Slurm away, or held by the admission
        step) holds its place in the guard's count: it will be carried out."""
        for name in pending:
            sn = self.snapshot.nodes.get(name)
            if sn is not None and sn.drained_or_draining:
                continue  # counted in Slurm's
            for p in (sn.partitions if sn is not None else ()) or ("default",):
                drained_by_us[p] = drained_by_us.get(p, 0) + 1
        return drained_by_us

    def _alerting_nodes(self) -> set[str]:
        """Nodes with a firing alert: the policy must see them to resolve it."""
        out = set()
        for key in self.router.firing_keys():
            node, _, _ = key.partition("|")
            if node != "cluster":
                out.add(node)
        return out

    def _node_facts(
        self,
        rows: list[dict[str, Any]],
        now: datetime,
        pending_drains: set[str] | None = None,
        drains_by_node: dict[str, list[datetime]] | None = None,
        xids: dict[str, list[tuple[str, int, datetime]]] | None = None,
        validations: dict[str, Any] | None = None,
    ) -> list[NodeFacts]:
        pending_drains = pending_drains or set()
        drains_by_node = drains_by_node or {}
        xids = xids or {}
        validations = validations or {}
        prefix = self.cfg.slurm.reason_prefix
        facts: list[NodeFacts] = []
        for r in rows:
            sn = self.snapshot.nodes.get(r["name"])
            last = r["last_report_at"]
            age = None if last is None else (now - last).total_seconds()
            dry_drained = self.settings.dry_run and bool(r["babysitter_drained"])
            if sn is not None:
                drained = sn.drained_or_draining or sn.down
                reason = sn.reason
                # a HealthCheckProgram drain (`check --slurm-drain`) is the check's to resume,
                # an admin's drain (rule manual) the admin's: only automatic ones are the policy's
                ours = automatic_reason(reason, prefix) or dry_drained
                parts = sn.partitions or ("default",)
            else:  # Slurm unreadable: last known state
                drained = bool(r["babysitter_drained"]) or bool(r.get("slurm_reason"))
                reason = r.get("slurm_reason") or ""
                ours = bool(r["babysitter_drained"])
                parts = ("default",)
            if dry_drained:
                drained = True
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
                    in_slurm=sn is not None or not self.snapshot.ok,
                    drain_pending=r["name"] in pending_drains,
                    recent_drains=tuple(drains_by_node.get(r["name"], [])),
                    xid_history=tuple(xids.get(r["name"], [])),
                    validation=validations[r["name"]].state if r["name"] in validations else "",
                    validation_failures=(
                        validations[r["name"]].failures if r["name"] in validations else 0
                    ),
                )
            )
        return facts

    def with_stragglers(
        self, facts: list[NodeFacts], now: datetime
    ) -> tuple[list[NodeFacts], list[Decision]]:
        """Compare each node's throughput with its GPU model's fleet median (pure policy in
        loop/decide/stragglers.py). A straggler the site wants drained becomes a drain-worthy
        finding of the node, so the blast-radius guard applies to it like to any other."""
        res = evaluate(self._perfs, self._straggler_streaks, self.straggler_settings)
        self._straggler_streaks = res.streaks
        drains = {d.node: d for d in res.decisions if d.kind is DecisionKind.DRAIN and d.node}
        missing = drains.keys() - {f.name for f in facts}
        if missing:  # healthy otherwise, so not passed this tick: the straggler finding is new
            facts = facts + self._node_facts(policy_rows(self.store, missing), now)
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
                DecisionKind.ALERT,
                d.node,
                d.rule,
                d.reason,
                Severity.WARNING,
                CONDITION,
                details=d.details,
            )
            if d.kind is DecisionKind.DRAIN
            else d
            for d in res.decisions
        ]
        return facts, alerts
