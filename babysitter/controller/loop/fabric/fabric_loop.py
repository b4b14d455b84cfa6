"""The fabric step of the remediation tick: reads Slurm's topology on its own slow schedule into
the node snapshot, runs the correlation policy (loop/decide/fabric.py) on the tick's facts,
hides what a switch incident answers for from the node policy, and carries out the incidents:
one alert per suspected switch, its nodes drained in one Slurm call (or left in service), the
babysat jobs there requeued away from them, and the nodes resumed together when the switch is
healthy again. It also builds the blast-radius gate (loop/decide/blast.py) the node policy asks
before each new drain, and publishes what tripped.

Incidents are kept in the store (kv `fabric_incidents`), so a restarted controller resumes
the nodes of an incident it opened before. Switch drains are recorded as actions with
requested_by `fabric` and pass the admission step (controller/loop/admit/admission.py) node by node:
an incident is one fault (it is not held by its own switch's cap, nor counted in a node's lemon
count), but each node it drains counts towards the partition and cluster caps and the rolling
hour's drain budget, so a spine incident cannot drain a partition past its cap."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import Gauge

from babysitter.controller.db import audit
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.episodes import start_drain_episodes
from babysitter.controller.db.tickstore import pending_drain_nodes
from babysitter.controller.loop.admit.admission import Admission
from babysitter.controller.loop.admit.gate import AdmittedSlurm, Held
from babysitter.controller.loop.decide.blast import (
    CLUSTER,
    BlastGate,
    BlastSettings,
    Scope,
    ScopeCounts,
)
from babysitter.controller.loop.decide.fabric import (
    Evidence,
    FabricSettings,
    FabricView,
    Incident,
    SwitchAction,
    correlate,
    is_fabric,
    onsets,
    switch_reason,
)
from babysitter.controller.loop.decide.policy import (
    ClusterFacts,
    NodeFacts,
    PolicyResult,
    PolicySettings,
    Rule,
    drain_worthy,
    facts_verdict,
)
from babysitter.controller.loop.jobs.jobs import JobTracker
from babysitter.controller.loop.read.context import LoopContext
from babysitter.controller.loop.read.guard import BLAST_KEY
from babysitter.controller.loop.record.alerts import Alert
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.finding import Severity
from babysitter.slurm.client import SlurmError, SlurmNotOwned, SlurmUnavailable
from babysitter.slurm.ownership import BABYSITTER_WRITTEN, automatic_body, reason_owner
from babysitter.slurm.topology import Topology

log = logging.getLogger(__name__)
INCIDENTS_KEY = "fabric_incidents"
CAP_CONDITION = "blast_radius_cap"
RETRY_S = 5.0  # a switch's drain/resume that Slurm could not take is tried again after this
TOPOLOGY_RETRY_S = 30.0  # a topology read that failed is tried again after this


SUSPECTED, RECOVERED = Rule.SWITCH_SUSPECTED, Rule.SWITCH_RECOVERED


def status_of(err: SlurmError | None) -> ActionStatus:
    """What became of one node's drain/resume in a switch's batch."""
    if err is None:
        return ActionStatus.DONE
    return ActionStatus.SKIPPED if isinstance(err, SlurmNotOwned) else ActionStatus.FAILED


def switch_condition(switch: str) -> str:
    return f"switch_suspected_{switch}"  # docs/operations.md: one section for the family


class FabricStep:
    @property
    def admitted(self) -> AdmittedSlurm:
        """Its Slurm changes, each admitted first (controller/loop/admit/gate.py)."""
        return AdmittedSlurm(self.slurm, self.admission)

    def __init__(
        self,
        ctx: LoopContext,
        jobs: JobTracker,
        metrics: ControllerMetrics,
        policy: PolicySettings,
        isolated: Callable[..., Any],
        admission: Admission | None = None,
    ) -> None:
        cfg = self.cfg = ctx.cfg
        self.admission = admission  # asked before each switch drain/resume
        self.store = ctx.store
        self.slurm = ctx.slurm
        self.snapshot = ctx.snapshot
        self.jobs = jobs
        self.policy = policy
        self.isolated = isolated
        self.settings = FabricSettings.from_config(cfg)
        self.blast = BlastSettings.from_config(cfg)
        self.enabled = cfg.fabric.enabled
        self.prefix = cfg.slurm.reason_prefix
        self._topology_due = float("-inf")
        self._topology_read: Future[Topology] | None = None
        self._topology_first = True
        # a topology was read (empty for a cluster without one): until then switch caps are
        # unknown and the admission step admits no drain where one is set
        self.topology_known = False
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="slurm-topology")
        self._evidence: dict[str, Evidence] = {}
        self.incidents: list[Incident] = self._load()
        self.view = FabricView(open=tuple(self.incidents))
        self.gate: BlastGate | None = None
        self._decided = False  # before_policy decided a view this tick
        self._bad: set[str] = set()  # nodes with a drain-worthy finding that is not fabric
        self._returning: frozenset[str] = frozenset()  # nodes of incidents resolved this tick
        self._verdicts: dict[str, str] = {}  # real verdicts of the nodes hidden this tick
        self._refused: dict[str, set[str]] = {}  # switch -> nodes Slurm would not drain
        self._retry_at: datetime | None = None
        self._settled: list[int] = []  # this tick's actions, audited at its end
        self._capped: set[str] = set()  # nodes a cap holds back (audited once, when first held)
        self._published: Any = None
        self.g_incidents = Gauge(
            "babysitter_switch_incidents",
            "Open switch_suspected incidents (fabric correlation).",
            registry=metrics.registry,
        )
        self.g_tripped = Gauge(
            "babysitter_blast_radius_tripped",
            "1 for each scope whose node-drain cap held a drain back this tick.",
            ["scope", "name"],
            registry=metrics.registry,
        )

    # ---- state
    def _load(self) -> list[Incident]:
        raw = self.store.kv_get(INCIDENTS_KEY) or []
        out = []
        for d in raw if isinstance(raw, list) else []:
            try:
                out.append(Incident.from_json(d))
            except (KeyError, TypeError, ValueError):
                log.warning("dropping an unreadable stored switch incident: %r", d)
        return out

    def _save(self) -> None:
        self.store.kv_set(INCIDENTS_KEY, [i.to_json() for i in self.incidents])

    @property
    def topology(self) -> Topology:
        return self.snapshot.topology

    def refresh_topology(self) -> None:
        """`scontrol show topology` every fabric.topology_refresh_s, on its own thread (at
        32,768 nodes the parse alone takes ~0.4 s: bench/fabric_scale.py): the first read is
        waited for, later ones are taken up by the tick after they finish. After a failed
        read (the last topology is kept) again within TOPOLOGY_RETRY_S, not every tick."""
        now = time.monotonic()
        if self._topology_read is None and now >= self._topology_due:
            self._topology_due = now + min(TOPOLOGY_RETRY_S, self.cfg.fabric.topology_refresh_s)
            self._topology_read = self._pool.submit(self.slurm.topology)
        read = self._topology_read
        if read is None:
            return
        first = not self.topology.known and self._topology_first
        try:
            topo = read.result(timeout=self.cfg.slurm.timeout_s if first else 0)
        except FutureTimeout:
            return
        except NotImplementedError:
            self.topology_known = True  # a backend without topology: no switch to cap
            return
        except SlurmError as exc:
            log.warning("cannot read Slurm's topology (keeping the last one): %r", exc)
            return
        finally:
            if read.done():
                self._topology_read = None
                self._topology_first = False
        self._topology_due = time.monotonic() + self.cfg.fabric.topology_refresh_s
        if topo.skipped:
            log.warning("%d topology line(s) could not be read", topo.skipped)
        self.snapshot.topology = topo
        self.topology_known = True

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- before the node policy
    def before_policy(
        self, facts: list[NodeFacts], cluster: ClusterFacts, now: datetime
    ) -> tuple[list[NodeFacts], ClusterFacts, Callable[[NodeFacts], bool] | None]:
        """Correlate, then the facts the node policy decides on (fabric findings of held and
        covered nodes hidden; a node a switch incident holds drained is not the node policy's
        to resume), the guard's counts without switch drains, and the blast-radius gate."""
        if self.enabled or self.blast.switch.active:
            self.isolated("topology", self.refresh_topology)
        if self.enabled:
            fabric = {
                n.name: n.open_findings for n in facts if any(map(is_fabric, n.open_findings))
            }
            self._evidence = onsets(fabric, self._evidence, now)
            self._bad = {
                n.name
                for n in facts
                if any(drain_worthy(f) and not is_fabric(f) for f in n.open_findings)
            }
            # a node with a fault of its own does not hold its switch's incident open: the
            # others return without it, and it stays the node policy's
            clean = {
                n.name: self.settings.clean_reports if n.name in self._bad else n.consecutive_clean
                for n in facts
            }
            self.view = correlate(
                self.topology, self._evidence, self.incidents, clean, self.settings, now
            )
            self._decided = True
            # the nodes of an incident resolved now return together in act(), not one by one
            self._returning = frozenset(n for inc in self.view.resolved for n in inc.nodes)
            hidden = self.view.held | self.view.covered | self._returning
            # what people read about these nodes stays the truth: their own verdict
            self._verdicts = {
                n.name: facts_verdict(n, self.policy)[0] for n in facts if n.name in hidden
            }
            if hidden:
                facts = [self._masked(n) if n.name in hidden else n for n in facts]
        switch_held = self._switch_held()
        if switch_held:
            cluster = replace(cluster, drained_by_us=self._without(cluster, switch_held))
        return facts, cluster, self.caps_gate(switch_held)

    def caps_gate(
        self, switch_held: dict[str, tuple[str, ...]] | None = None
    ) -> Callable[[NodeFacts], bool] | None:
        """The blast-radius gate the node policy asks before each new drain (None: no cap
        set). It needs no correlation: when that fails, the engine still asks this."""
        self.gate = None
        if not self.blast.active:
            return None
        gate = BlastGate(self.blast, self._scope_counts(switch_held or {}))
        topo = self.topology
        self.gate = gate
        return lambda n: gate.admit(n.name, topo.leaf(n.name), n.partitions)

    def true_verdicts(self, result: PolicyResult) -> None:
        """The node policy decided on facts with fabric findings hidden; the verdicts it
        writes for those nodes are their real ones (a node with its port down is never
        shown healthy)."""
        for name, verdict in self._verdicts.items():
            if name in result.verdicts:
                result.verdicts[name] = verdict

    def _masked(self, n: NodeFacts) -> NodeFacts:
        kept = tuple(f for f in n.open_findings if not is_fabric(f))
        answered = n.name in self.view.covered or n.name in self._returning
        held_by_switch = answered and self._switch_owned(n.reason)
        return replace(
            n,
            open_findings=kept,
            consecutive_clean=0 if held_by_switch else n.consecutive_clean,
        )

    def _switch_owned(self, reason: str) -> bool:
        """babysitter's automatic reason of a switch incident (slurm/ownership.py decides it
        is babysitter's automatic one at all)."""
        body = automatic_body(reason, self.prefix) or ""
        return body.startswith("switch ") and body.endswith(" suspected")

    def _switch_held(self) -> dict[str, tuple[str, ...]]:
        """Nodes Slurm holds drained for a switch incident -> their partitions."""
        out = {}
        for name in self.snapshot.held:
            sn = self.snapshot.nodes.get(name)
            if sn is not None and sn.drained_or_draining and self._switch_owned(sn.reason):
                out[name] = sn.partitions or ("default",)
        return out

    @staticmethod
    def _without(cluster: ClusterFacts, held: dict[str, tuple[str, ...]]) -> dict[str, int]:
        per = Counter(p for parts in held.values() for p in parts)
        return {p: max(0, n - per.get(p, 0)) for p, n in cluster.drained_by_us.items()}

    def _scope_counts(self, switch_held: dict[str, tuple[str, ...]]) -> ScopeCounts:
        """Sizes and node-drain counts of every scope (switch drains and pending drains
        included). Sizes of partitions and the cluster
        come from the snapshot's aggregates, switch sizes from the topology; the drained count
        walks only the nodes Slurm holds (a few, not the cluster)."""
        sizes: dict[tuple[Scope, str], int] = {
            (Scope.PARTITION, p): n for p, n in self.snapshot.partitions.items()
        }
        if self.snapshot.nodes:
            sizes[(Scope.CLUSTER, CLUSTER)] = len(self.snapshot.nodes)
        topo = self.topology
        drained: Counter[tuple[Scope, str]] = Counter()
        # drains decided but not carried out yet count as held: they will be
        pending = pending_drain_nodes(self.store)  # every one, counted in the database
        for name in self.snapshot.held | pending:
            sn = self.snapshot.nodes.get(name)
            if sn is None:  # a switch incident's drains count too: nodes out of service
                continue
            # every drain babysitter wrote counts against the caps (the safe side)
            written = reason_owner(sn.reason, self.prefix) in BABYSITTER_WRITTEN
            mine = sn.drained_or_draining and written
            if not mine and name not in pending:
                continue
            drained[(Scope.CLUSTER, CLUSTER)] += 1
            for p in sn.partitions or ("default",):
                drained[(Scope.PARTITION, p)] += 1
            if (leaf := topo.leaf(name)) is not None:
                drained[(Scope.SWITCH, leaf)] += 1
        if self.blast.switch.active:
            for sw in topo.switches.values():
                if sw.level == 0:
                    sizes[(Scope.SWITCH, sw.name)] = len(sw.nodes)
        return ScopeCounts(sizes, drained)

    # ---- after the node policy
    def act(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        """Carry out the incidents, then publish the incidents and the caps."""
        self._settled = []
        try:
            # only a view decided this tick is acted on (a failed correlation acts on nothing
            # twice); the open incidents' alerts are kept alive either way
            if self.enabled and self._decided:
                self._incidents(now, firing, clearing)
            elif self.enabled:
                firing.extend(self._alert(inc, now) for inc in self.incidents)
            self._decided = False
            self._caps(now, firing, clearing)
            self._publish()
        finally:
            # who did what to which node, on what evidence (controller/db/audit.py)
            self.isolated("audit", lambda: audit.record_actions(self.store, self._settled, now))

    def _incidents(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        view = self.view
        before = [i.to_json() for i in self.incidents]
        still = list(view.open)
        for inc in view.opened:
            log.warning("switch %s suspected: %s", inc.switch, ", ".join(sorted(inc.nodes)))
        fresh = {i.switch: i.nodes for i in view.opened} | dict(view.joined)
        jobs = self._requeue(fresh, now) if fresh and self.cfg.fabric.requeue_jobs else {}
        if jobs:
            still = [
                replace(i, jobs=tuple(sorted({*i.jobs, *jobs.get(i.switch, ())}))) for i in still
            ]
        retry_due = self._retry_at is None or now >= self._retry_at
        if self.settings.action is SwitchAction.DRAIN and self.snapshot.ok and retry_due:
            self._drain(still, now)
        for inc in view.resolved:
            if self._return(inc, now):
                clearing.append((None, switch_condition(inc.switch)))
                self._refused.pop(inc.switch, None)
                log.warning("switch %s healthy again: incident resolved", inc.switch)
            else:
                still.append(inc)  # resumed next time Slurm answers
        for inc in still:
            firing.append(self._alert(inc, now))
        self.incidents = still
        if [i.to_json() for i in still] != before:
            self._save()

    def _alert(self, inc: Incident, now: datetime) -> Alert:
        nodes = sorted(inc.nodes)
        jobs = ", ".join(map(str, inc.jobs)) or "none"
        if self.settings.action is SwitchAction.DRAIN:
            reason = switch_reason(inc.switch)
            did = f"drained {len(nodes)} node(s) in one call with reason '{reason}'"
        else:
            did = f"left {len(nodes)} node(s) in service (fabric.on_switch = keep)"
        if self.cfg.fabric.requeue_jobs:
            did += f"; babysat job(s) requeued without them: {jobs}"
        # what the agents saw of the fabric: which ports, which subnet manager
        seen = [self._evidence[n] for n in nodes if n in self._evidence]
        ports = Counter(p.split(":", 1)[1] for e in seen for p in e.ports)
        sm_lids = sorted({lid for e in seen for lid in e.sm_lids})
        where = ""
        if ports:
            where = "; ports: " + ", ".join(f"{p} on {k}" for p, k in sorted(ports.items()))
        if sm_lids:
            where += f"; subnet manager LID {', '.join(sm_lids)}"
        switch = inc.switch
        return Alert(
            None,
            f"switch_suspected_{switch}",
            Severity.CRITICAL,
            f"switch {inc.switch} suspected: fabric faults on {len(nodes)} node(s) below it "
            f"within {self.settings.window_s:g} s ({', '.join(nodes)}); jobs there: {jobs}" + where,
            did,
            inc.opened_at,
            nodes=nodes,
            details={
                "switch": inc.switch,
                "level": inc.level,
                "nodes": nodes,
                "jobs": list(inc.jobs),
                "ports": dict(sorted(ports.items())),
                "sm_lids": sm_lids,
            },
        )

    def _requeue(self, fresh: dict[str, frozenset[str]], now: datetime) -> dict[str, list[int]]:
        """Babysat jobs on the switch's nodes, requeued once with all of them excluded."""
        every = sorted({n for nodes in fresh.values() for n in nodes})
        try:
            listing = self.slurm.jobs_on(every)
        except SlurmError as exc:
            log.warning("cannot list the jobs under a suspected switch: %s", exc)
            return {}
        out: dict[str, list[int]] = {}
        for switch, nodes in fresh.items():
            ids: set[int] = set()
            for node in sorted(nodes):
                ids.update(self.jobs.babysat_on(node, listing))
            for job_id in sorted(ids):
                self.jobs.record_requeue(job_id, sorted(nodes), switch_reason(switch))
            out[switch] = sorted(ids)
        return out

    def _drain(self, incidents: Sequence[Incident], now: datetime) -> None:
        """Every node of an open incident that Slurm does not hold yet: one drain call per
        switch (again on the next tick for what Slurm could not take then)."""
        for inc in incidents:
            refused = self._refused.setdefault(inc.switch, set())
            todo = [
                n
                for n in sorted(inc.nodes)
                if (sn := self.snapshot.nodes.get(n)) is not None
                and not (sn.drained_or_draining or sn.down)
                and n not in refused
            ]
            reason = switch_reason(inc.switch)
            if not todo:
                continue
            if self.policy.dry_run:
                for n in todo:
                    refused.add(n)
                    self._record(
                        ActionKind.DRAIN, n, reason, SUSPECTED, ActionStatus.DONE, "dry-run", True
                    )
                continue
            # its drains count towards the caps and the drain budget like any other (the
            # gate asks the admission step); a held node is asked again on the next tick
            res = self.admitted.drain_many(todo, reason, now, switch_incident=True)
            todo = [n for n in todo if not isinstance(res[n], Held)]
            done = [n for n in todo if res[n] is None]
            for n in todo:
                err = res[n]
                if isinstance(err, SlurmUnavailable):
                    self._retry_at = now + timedelta(seconds=RETRY_S)
                    continue
                if err is not None:
                    refused.add(n)  # someone else's drain, or Slurm refused: not retried
                status = status_of(err)
                self._record(ActionKind.DRAIN, n, reason, SUSPECTED, status, str(err or "ok"))
            if done:
                self.store.update_nodes(
                    {
                        n: {"babysitter_drained": True, "drain_reason": reason, "drained_at": now}
                        for n in done
                    }
                )
                start_drain_episodes(self.store, done)  # old validations no longer count
                self.snapshot.moved_here([(n, reason) for n in done], [])

    def _return(self, inc: Incident, now: datetime) -> bool:
        """The switch is healthy: resume its nodes together (those it holds, without a fault
        of their own). With validation configured each returns through its own validation
        job instead (the node policy takes them over). False: Slurm did not answer."""
        reason = f"{self.prefix} {switch_reason(inc.switch)}"
        held = [
            n
            for n in sorted(inc.nodes)
            if (sn := self.snapshot.nodes.get(n)) is not None
            and sn.drained_or_draining
            and sn.reason == reason
            and n not in self._bad
        ]
        if not held or self.policy.validate_before_resume:
            return True
        if self.policy.dry_run:
            for n in held:
                self._record(
                    ActionKind.RESUME, n, reason, RECOVERED, ActionStatus.DONE, "dry-run", True
                )
            return True
        if not self.snapshot.ok:
            return False
        res = self.admitted.resume_many(held, now)  # admitted first
        held = [n for n in held if not isinstance(res[n], Held)]
        if any(isinstance(e, SlurmUnavailable) for e in res.values()):
            return False
        done = [n for n in held if res.get(n) is None]
        for n in held:
            err = res.get(n)
            self._record(ActionKind.RESUME, n, reason, RECOVERED, status_of(err), str(err or "ok"))
        if done:
            self.store.update_nodes(
                {
                    n: {"babysitter_drained": False, "drain_reason": None, "consecutive_clean": 0}
                    for n in done
                }
            )
            self.snapshot.moved_here([], done)
        return True

    def _record(
        self,
        kind: ActionKind,
        node: str,
        reason: str,
        rule: Rule,
        status: ActionStatus,
        outcome: str,
        dry_run: bool = False,
    ) -> None:
        aid = self.store.record_action(
            kind,
            node=node,
            reason=reason,
            rule=rule,
            requested_by=str(audit.Actor.FABRIC),
            status=status,
            outcome=outcome[:1000],
            dry_run=dry_run,
        )
        self._settled.append(aid)

    # ---- the caps
    def _caps(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        trips = self.gate.tripped() if self.gate is not None else []
        held = {n: t for t in trips for n in t.blocked}
        new = sorted(held.keys() - self._capped)
        self._capped = set(held)
        if new:
            self.isolated(
                "audit",
                lambda: audit.record(
                    self.store,
                    *(
                        audit.AuditEntry(
                            kind="drain",
                            actor=str(audit.Actor.POLICY),
                            result=audit.AuditResult.SKIPPED,
                            node=n,
                            rule=Rule.BLAST_RADIUS_CAP,
                            outcome=f"held by the node-drain cap: {held[n].reason}",
                            evidence=audit.evidence(self.store, [n]).get(n, []),
                            at=now,
                        )
                        for n in new
                    ),
                ),
            )
        self.g_tripped.clear()
        for t in trips:
            self.g_tripped.labels(str(t.scope), t.name).set(1)
        if not trips:
            clearing.append((None, CAP_CONDITION))
            return
        firing.append(
            Alert(
                None,
                CAP_CONDITION,
                Severity.CRITICAL,
                "node-drain cap reached in " + "; ".join(t.reason for t in trips),
                "stopped new node drains in "
                + ", ".join(f"{t.scope} {t.name}" for t in trips)
                + " only (resumes, switch incidents and other scopes go on)",
                now,
                nodes=sorted({n for t in trips for n in t.blocked}),
                details={"tripped": [t.public() for t in trips]},
            )
        )

    def _publish(self) -> None:
        """What `babysitter guard` and GET /api/v1/guard show, written when it changes."""
        self.g_incidents.set(len(self.incidents))
        trips = self.gate.tripped() if self.gate is not None else []
        info = {
            "caps": {
                str(scope): {
                    "fraction": self.blast.cap(scope).fraction,
                    "count": self.blast.cap(scope).count,
                }
                for scope in Scope
                if self.blast.cap(scope).active
            },
            "tripped": [t.public() for t in trips],
            "switch_incidents": [i.to_json() for i in self.incidents],
            "topology": self.topology.summary(),
        }
        if info != self._published:
            self.store.kv_set(BLAST_KEY, info)
            self._published = info
