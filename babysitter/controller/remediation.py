"""The remediation engine: every tick, gather facts (store + Slurm), run the pure policy, and
execute its decisions through the Slurm client, recording each in the actions log with the rule
that fired and the outcome; then alert. Runs only on the leader controller.

Safety: decisions become `pending` actions first; a pending drain for a node blocks new drain
decisions for it, so a drain that waits for slurmctld to come back is executed exactly once.
"""

from __future__ import annotations

import importlib
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from babysitter.config import Config
from babysitter.controller.alerts import Alert, AlertRouter
from babysitter.controller.alerts.router import sinks_from_config
from babysitter.controller.metrics import ControllerMetrics
from babysitter.controller.policy import (
    ClusterFacts,
    Decision,
    NodeFacts,
    PolicySettings,
    decide,
)
from babysitter.controller.store import Store, aware
from babysitter.slurm.client import (
    SlurmClient,
    SlurmError,
    SlurmNode,
    SlurmNotFound,
    SlurmNotOwned,
    SlurmUnavailable,
)

log = logging.getLogger(__name__)
GUARD_KEY = "guard_tripped"


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
        self.router = AlertRouter(
            sinks_from_config(cfg),
            store,
            repeat_interval=timedelta(seconds=cfg.alerts.repeat_interval_s),
            group_threshold=cfg.alerts.group_threshold,
            on_sent=lambda sink, state: metrics.alerts.labels(sink, state).inc(),
        )
        try:
            self.jobs: Any = importlib.import_module("babysitter.controller.jobs")
        except ImportError:
            self.jobs = None
        self.slurm_nodes: dict[str, SlurmNode] = {}
        self.slurm_ok = False
        # the node snapshot is re-read every slurm.node_refresh_s, or at once after a change
        self._slurm_read_at = 0.0
        self._slurm_stale = True
        self._written: dict[str, dict[str, Any]] = {}  # node columns last written by tick()

    # ---- facts
    def _read_slurm(self) -> None:
        """One snapshot of every Slurm node, shared by every decision of the tick. At 10,000
        nodes each read costs slurmctld ~20 ms of CPU (bench/slurm_load.py), so it is re-read
        at a bounded rate; ownership is re-checked by the drain/resume call itself."""
        fresh = time.monotonic() - self._slurm_read_at < self.cfg.slurm.node_refresh_s
        if self.slurm_ok and fresh and not self._slurm_stale:
            return
        try:
            self.slurm_nodes = {n.name: n for n in self.slurm.nodes()}
            self.slurm_ok = True
            self._slurm_read_at = time.monotonic()
            self._slurm_stale = False
        except SlurmError as exc:
            if self.slurm_ok:
                log.warning("Slurm unavailable, decisions will wait: %s", exc)
            self.slurm_ok = False

    def facts(self, now: datetime) -> tuple[list[NodeFacts], ClusterFacts]:
        rows = self.store.node_rows()
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
            since=now - timedelta(hours=24), severity="critical", limit=10_000
        ):
            if f["code"].startswith("xid.") and f["code"][4:].isdigit():
                xids.setdefault(f["node"], []).append(
                    (f["component"], int(f["code"][4:]), f["observed_at"])
                )
        prefix = self.cfg.slurm.reason_prefix
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
                ours = reason.startswith(prefix) or dry_drained
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
        self._read_slurm()
        facts, cluster = self.facts(now)
        result = decide(facts, cluster, self.settings, now)
        firing: list[Alert] = []
        clearing: list[tuple[str | None, str]] = []
        batch: list[tuple[int, Decision]] = []  # real drains/resumes: batched after the loop
        for d in result.decisions:
            if d.kind in ("drain", "resume"):
                aid = self.store.record_action(
                    d.kind,
                    node=d.node,
                    reason=d.reason,
                    rule=d.rule,
                    requested_by="policy",
                    dry_run=d.dry_run,
                )
                if not d.dry_run and self.slurm_ok and d.node:
                    batch.append((aid, d))
                    continue
                outcome = self._execute(aid, d.kind, d.node, None, d.reason, d.dry_run, now)
                self._node_alert(d, outcome, firing, clearing, now)
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
                        "critical",
                        d.reason,
                        "stopped draining (resumes still allowed)",
                        now,
                        details=d.details,
                    )
                )
            elif d.kind in ("alert", "escalate"):
                firing.append(
                    Alert(
                        d.node, d.condition, d.severity, d.reason, "nothing changed in Slurm", now
                    )
                )
            elif d.kind == "resolve_alert":
                clearing.append((d.node, d.condition))
        for (_aid, d), outcome in zip(batch, self._execute_batch(batch, now), strict=True):
            self._node_alert(d, outcome, firing, clearing, now)
        self._run_pending(now)
        changes: dict[str, dict[str, Any]] = {}
        for name, verdict in result.verdicts.items():
            sn = self.slurm_nodes.get(name)
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
        if not result.guard_tripped:
            clearing.append((None, "guard_tripped"))
        self.router.process(firing, clearing, now)
        if self.jobs is not None:
            self.jobs.tick(self, now)
        return result.decisions

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
            firing.append(Alert(d.node, "node_unhealthy", "critical", d.reason, done, now))
        else:
            clearing.append((d.node, "node_unhealthy"))

    def _execute_batch(self, batch: list[tuple[int, Decision]], now: datetime) -> list[str]:
        """The tick's drains and resumes: one Slurm call per (kind, reason) group, each of
        which re-checks ownership of exactly its nodes first (a rack of 32 nodes failing
        alike is one lookup and one `scontrol update NodeName=a,b,...`); then one job listing
        for every node drained, for the requeues. Returns each action's new status."""
        groups: dict[tuple[str, str], list[tuple[int, Decision]]] = {}
        for aid, d in batch:
            groups.setdefault((d.kind, d.reason if d.kind == "drain" else ""), []).append((aid, d))
        status: dict[int, str] = {}
        drained: list[tuple[str, str]] = []
        for (kind, reason), items in groups.items():
            nodes = [d.node for _, d in items if d.node]
            try:
                res = (
                    self.slurm.drain_many(nodes, reason)
                    if kind == "drain"
                    else self.slurm.resume_many(nodes)
                )
            except SlurmError as exc:  # e.g. a reason Slurm cannot take: the whole group
                res = {n: exc for n in nodes}
            for aid, d in items:
                assert d.node is not None
                err = res.get(d.node, SlurmError(f"{kind} {d.node}: no answer for this node"))
                status[aid] = self._settle(aid, kind, d.node, d.reason, err, now)
                if kind == "drain" and status[aid] == "done":
                    drained.append((d.node, d.reason))
        if batch:
            self._slurm_stale = True
        if drained and self.jobs is not None:
            try:
                jobs = self.slurm.jobs_on([n for n, _ in drained])
            except SlurmError as exc:
                log.warning("drained %d node(s) but cannot list their jobs: %s", len(drained), exc)
            else:
                for node, reason in drained:
                    self.jobs.on_drain(self, node, reason, now, jobs=jobs)
        return [status[aid] for aid, _ in batch]

    def _settle(
        self,
        aid: int,
        kind: str,
        node: str,
        reason: str,
        err: SlurmError | None,
        now: datetime,
        attempts: int = 0,
    ) -> str:
        """Record the outcome of a drain/resume of one node; returns the action's status."""
        if err is None:
            if kind == "drain":
                self.store.set_node(
                    node, babysitter_drained=True, drain_reason=reason, drained_at=now
                )
                self.metrics.drains.labels("done").inc()
            else:
                self.store.set_node(
                    node, babysitter_drained=False, drain_reason=None, consecutive_clean=0
                )
                self.metrics.resumes.labels("done").inc()
            self.store.update_action(
                aid, status="done", done_at=now, attempts=attempts + 1, outcome="ok"
            )
            return "done"
        if isinstance(err, SlurmUnavailable):
            delay = min(30.0, 0.5 * 2**attempts)
            self.store.update_action(
                aid,
                attempts=attempts + 1,
                outcome=f"waiting: {err}",
                next_attempt_at=now + timedelta(seconds=delay),
            )
            return "pending"
        if isinstance(err, SlurmNotOwned):
            self.store.update_action(aid, status="skipped", done_at=now, outcome=str(err))
            return "skipped"
        self.store.update_action(
            aid, status="failed", done_at=now, outcome=str(err), attempts=attempts + 1
        )
        if kind == "drain":
            self.metrics.drains.labels("failed").inc()
        return "failed"

    def _run_pending(self, now: datetime) -> None:
        for a in self.store.pending_actions():
            nxt = aware(a["next_attempt_at"])
            if nxt and nxt > now:
                continue
            self._execute(
                a["id"],
                a["kind"],
                a["node"],
                a["job_id"],
                a["reason"] or "",
                a["dry_run"],
                now,
                attempts=a["attempts"],
            )

    def _execute(
        self,
        aid: int,
        kind: str,
        node: str | None,
        job_id: int | None,
        reason: str,
        dry_run: bool,
        now: datetime,
        attempts: int = 0,
    ) -> str:
        """Run one action; returns its new status."""
        if not dry_run and not self.slurm_ok and kind != "guard_reset":
            # Slurm was unreachable at the start of this tick: keep it for the retry loop
            delay = min(30.0, 0.5 * 2**attempts)
            self.store.update_action(
                aid,
                attempts=attempts + 1,
                outcome="waiting for Slurm",
                next_attempt_at=now + timedelta(seconds=delay),
            )
            return "pending"
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
        if kind in ("drain", "resume") and node:
            self._slurm_stale = True
            err: SlurmError | None = None
            try:
                if kind == "drain":
                    self.slurm.drain(node, reason)
                else:
                    self.slurm.resume(node)
            except SlurmError as exc:
                err = exc
            st = self._settle(aid, kind, node, reason, err, now, attempts)
            if st == "done" and kind == "drain" and self.jobs is not None:
                self.jobs.on_drain(self, node, reason, now)
            return st
        try:
            if kind == "requeue" and job_id:
                self.slurm.requeue(job_id)
                self.metrics.requeues.labels("done").inc()
            elif kind == "guard_reset":
                self.store.kv_set(GUARD_KEY, False)
            else:
                raise SlurmError(f"cannot execute {kind} without its target")
        except SlurmUnavailable as exc:
            delay = min(30.0, 0.5 * 2**attempts)
            self.store.update_action(
                aid,
                attempts=attempts + 1,
                outcome=f"waiting: {exc}",
                next_attempt_at=now + timedelta(seconds=delay),
            )
            return "pending"
        except SlurmNotOwned as exc:
            self.store.update_action(aid, status="skipped", done_at=now, outcome=str(exc))
            return "skipped"
        except (SlurmNotFound, SlurmError) as exc:
            self.store.update_action(
                aid, status="failed", done_at=now, outcome=str(exc), attempts=attempts + 1
            )
            if kind == "drain":
                self.metrics.drains.labels("failed").inc()
            return "failed"
        self.store.update_action(
            aid, status="done", done_at=now, attempts=attempts + 1, outcome="ok"
        )
        return "done"
