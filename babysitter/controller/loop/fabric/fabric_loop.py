"""The fabric step of the remediation tick: reads Slurm's topology on its own slow schedule into
the node snapshot, runs the correlation policy (loop/decide/fabric.py) on the tick's facts,
hides what a switch incident answers for from the node policy, and carries out the incidents
(incidents.py, grouped by switch): one alert per suspected switch, its nodes drained in one
Slurm call (or left in service), the babysat jobs there requeued away from them, and the nodes
resumed together when the switch is healthy again. It also builds the blast-radius gate
(loop/decide/blast.py, caps.py) the node policy asks before each new drain, and publishes what
tripped.

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
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from datetime import datetime
from typing import Any

from prometheus_client import Gauge

from babysitter.controller.db import audit
from babysitter.controller.loop.admit.admission import Admission
from babysitter.controller.loop.decide.blast import BlastGate, BlastSettings
from babysitter.controller.loop.decide.fabric import (
    FabricView,
    Incident,
    SwitchAction,
    correlate,
    is_fabric,
    switch_reason,
)
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.fabric.caps import (
    CAP_CONDITION,
    cap_alert,
    drained_without,
    guard_info,
    held_back_entries,
    held_by_incidents,
    scope_counts,
)
from babysitter.controller.loop.fabric.incidents import Grouping, IncidentStep, Troubled
from babysitter.controller.loop.jobs.jobs import JobTracker
from babysitter.controller.loop.read.context import LoopContext
from babysitter.controller.loop.read.guard import BLAST_KEY
from babysitter.controller.loop.record.alerts import Alert
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.finding import Severity
from babysitter.slurm.client import SlurmError
from babysitter.slurm.topology import Topology

log = logging.getLogger(__name__)
INCIDENTS_KEY = "fabric_incidents"
TOPOLOGY_RETRY_S = 30.0  # a topology read that failed is tried again after this


SUSPECTED, RECOVERED = Rule.SWITCH_SUSPECTED, Rule.SWITCH_RECOVERED


def switch_condition(switch: str) -> str:
    return f"switch_suspected_{switch}"  # docs/operations.md: one section for the family


SWITCHES = Grouping(
    noun="switch",  # its reason: switch_reason
    store_key=INCIDENTS_KEY,
    condition=switch_condition,
    is_fault=is_fabric,
    suspected=SUSPECTED,
    recovered=RECOVERED,
    gauge=("babysitter_switch_incidents", "Open switch_suspected incidents (fabric correlation)."),
)


class FabricStep(IncidentStep):
    def __init__(
        self,
        ctx: LoopContext,
        jobs: JobTracker,
        metrics: ControllerMetrics,
        policy: PolicySettings,
        isolated: Callable[..., Any],
        admission: Admission | None = None,
    ) -> None:
        super().__init__(ctx, SWITCHES, policy, admission, metrics.registry, isolated)
        self.jobs = jobs
        self.blast = BlastSettings.from_config(self.cfg)
        self._topology_due = float("-inf")
        self._topology_read: Future[Topology] | None = None
        self._topology_first = True
        # a topology was read (empty for a cluster without one): until then switch caps are
        # unknown and the admission step admits no drain where one is set
        self.topology_known = False
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="slurm-topology")
        self.gate: BlastGate | None = None
        self._capped: set[str] = set()  # nodes a cap holds back (audited once, when first held)
        self._published: Any = None
        self.g_tripped = Gauge(
            "babysitter_blast_radius_tripped",
            "1 for each scope whose node-drain cap held a drain back this tick.",
            ["scope", "name"],
            registry=metrics.registry,
        )

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
        """Correlate, then the facts the node policy decides on (incidents.py), the guard's
        counts without switch drains, and the blast-radius gate."""
        if self.enabled or self.blast.switch.active:
            self.isolated("topology", self.refresh_topology)
        if self.enabled:
            facts = self._decide(facts, now)
        switch_held = held_by_incidents(self.snapshot, self._owned)
        if switch_held:
            cluster = replace(cluster, drained_by_us=drained_without(cluster, switch_held))
        return facts, cluster, self.caps_gate(switch_held)

    def _correlate(self, troubled: Troubled, clean: Mapping[str, int], now: datetime) -> FabricView:
        # the switches are Slurm's topology (correlate is looked up here: tests replace it)
        return correlate(self.topology, self._evidence, self.incidents, clean, self.settings, now)

    def caps_gate(
        self, switch_held: dict[str, tuple[str, ...]] | None = None
    ) -> Callable[[NodeFacts], bool] | None:
        """The blast-radius gate the node policy asks before each new drain (None: no cap
        set). It needs no correlation: when that fails, the engine still asks this."""
        self.gate = None
        if not self.blast.active:
            return None
        topo = self.topology
        gate = BlastGate(
            self.blast, scope_counts(self.snapshot, self.store, self.prefix, self.blast, topo)
        )
        self.gate = gate
        return lambda n: gate.admit(n.name, topo.leaf(n.name), n.partitions)

    # ---- after the node policy
    def _drains(self) -> bool:
        return self.settings.action is SwitchAction.DRAIN

    def _requeue_away(
        self, view: FabricView, still: list[Incident], now: datetime
    ) -> list[Incident]:
        fresh = {i.switch: i.nodes for i in view.opened} | dict(view.joined)
        jobs = self._requeue(fresh, now) if fresh and self.cfg.fabric.requeue_jobs else {}
        if not jobs:
            return still
        return [replace(i, jobs=tuple(sorted({*i.jobs, *jobs.get(i.switch, ())}))) for i in still]

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

    def _alert(self, inc: Incident) -> Alert:
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
        return Alert(
            None,
            switch_condition(inc.switch),
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

    def _after(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        """The caps' alert and audit, then what `babysitter guard` shows."""
        self._caps(now, firing, clearing)
        self._publish()

    def _caps(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        trips = self.gate.tripped() if self.gate is not None else []
        held = {n: t.reason for t in trips for n in t.blocked}
        new = sorted(held.keys() - self._capped)
        self._capped = set(held)
        if new:
            self.isolated(
                "audit",
                lambda: audit.record(self.store, *held_back_entries(self.store, held, new, now)),
            )
        self.g_tripped.clear()
        for t in trips:
            self.g_tripped.labels(str(t.scope), t.name).set(1)
        if not trips:
            clearing.append((None, CAP_CONDITION))
            return
        firing.append(cap_alert(trips, now))

    def _publish(self) -> None:
        """What `babysitter guard` and GET /api/v1/guard show, written when it changes."""
        self.g_incidents.set(len(self.incidents))
        trips = self.gate.tripped() if self.gate is not None else []
        info = guard_info(self.blast, trips, self.incidents, self.topology)
        if info != self._published:
            self.store.kv_set(BLAST_KEY, info)
            self._published = info
