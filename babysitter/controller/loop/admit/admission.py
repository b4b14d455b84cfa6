"""One admission step for every automatic action, asked right before it is executed (not only
when it was decided): a drain, a reboot, a GPU reset, a resume or a validation job of babysitter's
own goes to Slurm only when

- its node's current reason is babysitter's own automatic one (an admin's reason, `[manual]`
  through babysitter included, and the HealthCheckProgram's are someone else's): reboot, reset,
  resume and validation need it; a drain needs the node to carry no one else's reason;
- no cap would be exceeded, counting what is done (Slurm's drained nodes with our reason) and
  what is pending (drains queued ahead of this one): switch, partition and cluster caps
  ([blast_radius]), the node policy's partition share ([policy] max_drained_fraction), the
  rolling hour's drain budget ([policy] max_drains_per_hour, counted in the database) and
  reboots at once ([remediation] max_concurrent_*). (The breaker stops new drain decisions
  in the policy; what it decided before it tripped was within the caps and still is);
- everything it needs to know is known: a stale Slurm listing, an unreadable topology (with a
  switch cap set) or maintenance windows that could not be read admit nothing new.

A refused action is held, not failed: it stays pending with the refusal as its outcome, is
asked again on every tick (the executor's `held`), counted by rule in
`babysitter_admission_refusals_total` and paged as one `admission_held` alert.

`decide_admission` is the pure core (tests/test_admission.py, tests/test_invariants.py);
`Admission` gathers its inputs from the loop's snapshot and the store."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from prometheus_client import Counter

from babysitter.config import Config
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import drains_since, pending_drain_nodes
from babysitter.controller.loop.admit.refusal import Act, Refusal, Why
from babysitter.controller.loop.decide.blast import BlastSettings
from babysitter.controller.loop.decide.node.drain_guard import drained_cap
from babysitter.controller.loop.read.ledger import ACTIVE, Ledger, Phase
from babysitter.controller.loop.read.snapshot import SlurmSnapshot
from babysitter.controller.loop.record.alerts import Alert
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.finding import Severity
from babysitter.slurm.client import SlurmClient, SlurmError, SlurmNode
from babysitter.slurm.ownership import (
    BABYSITTER_WRITTEN,
    ReasonOwner,
    automatic_body,
    automatic_reason,
    reason_owner,
)
from babysitter.slurm.topology import Topology

log = logging.getLogger(__name__)
CONDITION = "admission_held"
SWITCH_REASON = re.compile(r"^switch \S+ suspected$")  # fabric.switch_reason
HOLD_RETRY_S = 30.0  # a held action's retry time: past it, Slurm is read before it is asked


@dataclass(frozen=True)
class Limits:
    blast: BlastSettings = field(default_factory=BlastSettings)
    max_drained_fraction: float = 1.0
    min_drainable: int = 1
    max_drains_per_hour: int = 1_000_000
    max_concurrent_reboots: int = 1_000_000
    max_concurrent_fraction: float = 0.0

    def guard_limit(self, size: int) -> float:
        """The policy's drain limit (`drained_cap`), with these limits."""
        return drained_cap(size, self.min_drainable, self.max_drained_fraction)

    @classmethod
    def from_config(cls, cfg: Config) -> Limits:
        p, r = cfg.policy, cfg.remediation
        return cls(
            BlastSettings.from_config(cfg),
            p.max_drained_fraction,
            p.min_drainable,
            p.max_drains_per_hour,
            r.max_concurrent_reboots,
            r.max_concurrent_fraction,
        )


@dataclass(frozen=True)
class World:
    """What admission reads; None = could not be read (and then nothing new is admitted)."""

    nodes: Mapping[str, SlurmNode] | None  # Slurm's nodes (a listing of this tick)
    held: Collection[str]  # nodes counted drained by babysitter: Slurm's + pending ahead
    # of those, the ones whose place is theirs whatever becomes of a drain asked for them now
    # (babysitter's in Slurm, in an episode or a validation): not a pending drain alone
    placed: Collection[str] = ()
    # of those, the ones a switch incident drained: not the node policy's partition share
    switch_held: Collection[str] = ()
    topology: Topology | None = field(default_factory=Topology)
    # node -> its NVLink domain (controller/loop/fabric/nvlink_domain.py; none known: no domain cap)
    domains: Mapping[str, str] = field(default_factory=dict)
    drains_last_hour: int | None = 0  # automatic drains done in the rolling hour
    rebooting: Collection[str] = ()  # nodes in a reboot babysitter issued
    quiet: Collection[str] | None = ()  # nodes in a maintenance window
    prefix: str = "babysitter:"


def _owner(reason: str, prefix: str) -> str:
    owner = reason_owner(reason, prefix)
    if owner is ReasonOwner.MANUAL:
        return "the admin's (babysitter drain)"
    if owner is ReasonOwner.HEALTHCHECK:
        return "the HealthCheckProgram's"
    return f"someone else's ({reason[:60]!r})"


def _ownership(act: Act, sn: SlurmNode, prefix: str) -> Refusal | None:
    mine = automatic_reason(sn.reason, prefix)
    if act is Act.DRAIN:
        # over no reason or over our own (a re-reason); never over anyone else's
        if sn.reason and not mine:
            return Refusal(Why.OWNERSHIP, f"ownership: reason is {_owner(sn.reason, prefix)}")
        return None
    if mine:
        return None
    if act in (Act.RESUME, Act.VALIDATE) and not sn.reason and not sn.drained_or_draining:
        return None  # in service already: nothing of anyone's to take over
    if not sn.reason:
        return Refusal(Why.OWNERSHIP, "ownership: not drained by babysitter")
    return Refusal(Why.OWNERSHIP, f"ownership: reason is {_owner(sn.reason, prefix)}")


def _parts(sn: SlurmNode | None) -> tuple[str, ...]:
    return (sn.partitions if sn is not None else ()) or ("default",)


@dataclass
class _Counts:
    """Per scope: size and nodes counted drained, grown as a batch admits nodes."""

    sizes: dict[tuple[str, str], int] = field(default_factory=dict)
    drained: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, keys: Sequence[tuple[str, str]]) -> None:
        for k in keys:
            self.drained[k] = self.drained.get(k, 0) + 1


def _counts(w: World, nodes: Mapping[str, SlurmNode], exclude: Collection[str]) -> _Counts:
    c = _Counts()
    for sn in nodes.values():
        for p in _parts(sn):
            c.sizes[("partition", p)] = c.sizes.get(("partition", p), 0) + 1
    c.sizes[("cluster", "cluster")] = len(nodes)
    topo = w.topology or Topology()
    for sw in topo.switches.values():
        if sw.level == 0:
            c.sizes[("switch", sw.name)] = len(sw.nodes)
    for node, d in w.domains.items():
        c.sizes[("domain", d)] = c.sizes.get(("domain", d), 0) + 1
        for p in _parts(nodes.get(node)):  # a partition with NVLink domains: see _cap_refusal
            c.sizes[("fabric", p)] = 1
    for n in set(w.held) - set(exclude):
        c.add(_scopes(n, nodes.get(n), topo, switch_cap=True, domain=w.domains.get(n)))
        if n not in w.switch_held:
            c.add([("guard", p) for p in _parts(nodes.get(n))])
    for key, size in list(c.sizes.items()):
        if key[0] == "partition":
            c.sizes[("guard", key[1])] = size
    return c


def _scopes(
    n: str, sn: SlurmNode | None, topo: Topology, switch_cap: bool, domain: str | None = None
) -> list[tuple[str, str]]:
    out = [("partition", p) for p in _parts(sn)] + [("cluster", "cluster")]
    if switch_cap and (leaf := topo.leaf(n)) is not None:
        out.append(("switch", leaf))
    if domain is not None:
        out.append(("domain", domain))
    return out


def _cap_refusal(
    n: str, sn: SlurmNode, w: World, lim: Limits, c: _Counts, switch_incident: bool
) -> Refusal | None:
    topo = w.topology or Topology()
    caps: list[tuple[tuple[str, str], Why, Callable[[int], float]]] = []
    for p in _parts(sn):
        if lim.blast.partition.active:
            caps.append((("partition", p), Why.CAP_PARTITION, lim.blast.partition.limit))
        if not switch_incident:  # the node policy's share: a switch incident is not its drain
            caps.append((("guard", p), Why.CAP_GUARD, lim.guard_limit))
    if lim.blast.cluster.active:
        caps.append((("cluster", "cluster"), Why.CAP_CLUSTER, lim.blast.cluster.limit))
    # a switch incident drains its own switch's nodes: that switch's cap is not asked
    leaf = None if switch_incident else topo.leaf(n)
    if leaf is not None and lim.blast.switch.active:
        caps.append((("switch", leaf), Why.CAP_SWITCH, lim.blast.switch.limit))
    # the same for an NVLink domain: its incident drains its own domain, uncapped by it
    domain = None if switch_incident else w.domains.get(n)
    if domain is not None and lim.blast.domain.active:
        caps.append((("domain", domain), Why.CAP_DOMAIN, lim.blast.domain.limit))
    elif (
        not switch_incident
        and lim.blast.domain.active
        and n not in w.domains
        and any(("fabric", p) in c.sizes for p in _parts(sn))
    ):
        # its partition has NVLink domains but its own is not known (an agent of an older
        # wire version, no Slurm block): held, not drained outside every domain cap. A
        # partition with no domain at all has no NVLink fabric: no domain cap applies there
        return Refusal(Why.UNKNOWN, "scope unknown: NVLink domain not known")
    for key, why, limit_of in caps:
        size = c.sizes.get(key)
        if size is None:
            return Refusal(Why.UNKNOWN, f"count unknown: size of {key[0]} {key[1]}")
        have = c.drained.get(key, 0)
        limit = limit_of(size)
        if have + 1 > limit:
            if why is Why.CAP_GUARD:
                return Refusal(why, f"share partition {key[1]} {have}/{limit:g}")
            return Refusal(why, f"cap {key[0]} {key[1]} {have}/{limit:g}")
    return None


def decide_admission(
    act: Act,
    nodes: Sequence[str],
    w: World,
    lim: Limits,
    switch_incident: bool = False,
) -> dict[str, Refusal | None]:
    """Per node None (admitted) or why not, in order: a batch admits while there is room and
    counts what it admitted, so two drains of one call cannot both squeeze under a cap."""
    out: dict[str, Refusal | None] = {}
    if w.quiet is None:
        return dict.fromkeys(nodes, Refusal(Why.UNKNOWN, "maintenance windows unreadable"))
    if w.nodes is None:
        return dict.fromkeys(nodes, Refusal(Why.UNKNOWN, "count unknown: slurm snapshot stale"))
    listing = w.nodes
    # a node of the batch is counted only where its place is its own already (an episode's):
    # it keeps it whether or not this drain of it is admitted, and draining it adds none
    placed = set(w.placed)
    c = _counts(w, listing, exclude=set(nodes) - placed) if act is Act.DRAIN else _Counts()
    rate = w.drains_last_hour
    rebooting = set(w.rebooting) - set(nodes)
    for n in nodes:
        sn = listing.get(n)
        if n in w.quiet:
            out[n] = Refusal(Why.MAINTENANCE, f"{n} is in a maintenance window")
            continue
        if sn is None:
            out[n] = Refusal(Why.UNKNOWN, f"state unknown: {n} not in Slurm's listing")
            continue
        if (own := _ownership(act, sn, w.prefix)) is not None:
            out[n] = own
            continue
        if act is Act.REBOOT:
            out[n] = _reboot_refusal(n, sn, listing, rebooting, lim)
            if out[n] is None:
                rebooting.add(n)
            continue
        if act is not Act.DRAIN or (
            sn.drained_or_draining and automatic_reason(sn.reason, w.prefix)
        ):
            out[n] = None  # not a new drain (a re-reason of our own drain adds nothing)
            continue
        out[n] = _drain_refusal(n, sn, w, lim, c, rate, n in placed, switch_incident)
        if out[n] is not None or rate is None:
            continue
        rate += 1
        if n in placed:
            continue
        c.add(_scopes(n, sn, w.topology or Topology(), switch_cap=True, domain=w.domains.get(n)))
        if not switch_incident:
            c.add([("guard", p) for p in _parts(sn)])
    return out


def _drain_refusal(
    n: str,
    sn: SlurmNode,
    w: World,
    lim: Limits,
    c: _Counts,
    rate: int | None,
    placed: bool,
    switch_incident: bool,
) -> Refusal | None:
    """Why a new drain of `n` is refused (None: admitted): a count it needs is unknown, the
    hourly rate or a cap of one of its scopes is reached. `rate`: drains of the last hour,
    this batch's admitted ones included; `placed`: its place is its own already."""
    if lim.blast.switch.active and not switch_incident and w.topology is None:
        return Refusal(Why.UNKNOWN, "count unknown: topology unreadable (switch cap)")
    if rate is None:
        return Refusal(Why.UNKNOWN, "count unknown: drains of the last hour unreadable")
    if rate + 1 > lim.max_drains_per_hour:
        return Refusal(Why.CAP_RATE, f"cap rate {rate}/{lim.max_drains_per_hour} per hour")
    return None if placed else _cap_refusal(n, sn, w, lim, c, switch_incident)


def _reboot_refusal(
    n: str, sn: SlurmNode, listing: Mapping[str, SlurmNode], rebooting: set[str], lim: Limits
) -> Refusal | None:
    """Room for one more node in reboot in each of its partitions: max(K, P x size)."""
    for p in _parts(sn):
        size = sum(1 for x in listing.values() if p in _parts(x))
        limit = max(lim.max_concurrent_reboots, int(lim.max_concurrent_fraction * size))
        busy = sum(1 for r in rebooting if p in _parts(listing.get(r)))
        if busy + 1 > limit:
            return Refusal(Why.CAP_REBOOTS, f"cap reboots partition {p} {busy}/{limit}")
    return None


class Admission:
    """The loop's admission step: gathers the world right before an action and asks
    decide_admission. One per engine; the engine sets `quiet` each tick (None: the
    maintenance windows could not be read) and `topology_known` comes from the fabric step."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        slurm: SlurmClient,
        snapshot: SlurmSnapshot,
        metrics: ControllerMetrics,
        topology_known: Callable[[], bool] = lambda: True,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.slurm = slurm
        self.snapshot = snapshot
        self.limits = Limits.from_config(cfg)
        self.prefix = cfg.slurm.reason_prefix
        self.topology_known = topology_known
        # node -> NVLink domain, from the domain step (set by the engine; none: no domain cap)
        self.domains: Callable[[], Mapping[str, str]] = dict
        self.quiet: Collection[str] | None = ()
        self.refused: dict[str, Refusal] = {}  # this tick's refusals: node -> why
        self.before: dict[str, Refusal] = {}  # the last tick's
        self.refusals = Counter(
            "babysitter_admission_refusals",
            "Automatic actions held by the admission step (controller/loop/admit/admission.py), by "
            "the rule that held them.",
            ["rule", "action"],
            registry=metrics.registry,
        )
        for why in Why:  # known label values start at 0: increase() sees the first one
            for act in Act:
                self.refusals.labels(str(why), str(act))

    def world(self, now: datetime, before_action: int | None = None) -> World:
        """The world right now: Slurm's listing of this tick (None when it is not current),
        the nodes babysitter holds drained in it plus the drains pending ahead of
        `before_action` (all pending drains when None), the rolling hour's drains counted in
        the database, the reboots in flight, the breaker."""
        snap = self.snapshot
        nodes = snap.nodes if snap.ok else None
        held: set[str] = set()
        switch_held: set[str] = set()
        placed: set[str] = set()
        if nodes is not None:
            # down with our reason counts too: back from a reboot, not yet returned
            held = {
                n
                for n, sn in nodes.items()
                if (sn.drained_or_draining or sn.down)
                and reason_owner(sn.reason, self.prefix) in BABYSITTER_WRITTEN
            }
            switch_held = {
                n
                for n in held
                if SWITCH_REASON.match((automatic_body(nodes[n].reason, self.prefix) or "").strip())
            }
            placed = set(held)
        # counted in the database: every pending drain, not only the newest 1,000 actions
        held |= pending_drain_nodes(self.store, before_action)
        try:
            rate: int | None = drains_since(self.store, now - timedelta(hours=1))
        except Exception:
            log.exception("cannot count the drains of the last hour")
            rate = None
        episodes = Ledger(self.store).open_rows()
        rebooting = {r.node for r in episodes if r.state is Phase.REBOOTING}
        # a node in a remediation episode or a validation job is babysitter's even while Slurm
        # shows it back (inside its reservation, or down after the reboot): a failed verdict
        # drains it again, so it keeps its place in every cap
        placed |= {r.node for r in episodes if r.state in ACTIVE}
        placed |= {
            a.node
            for a in self.store.actions(status=ActionStatus.RUNNING)
            if a.kind is ActionKind.VALIDATE and a.node
        }
        held |= placed
        return World(
            nodes=nodes,
            held=held,
            placed=placed,
            switch_held=switch_held,
            topology=snap.topology if self.topology_known() else None,
            domains=self.domains(),
            drains_last_hour=rate,
            rebooting=rebooting,
            quiet=self.quiet,
            prefix=self.prefix,
        )

    def check(
        self,
        act: Act,
        nodes: Sequence[str],
        now: datetime,
        *,
        before_action: int | None = None,
        switch_incident: bool = False,
        fresh: Mapping[str, SlurmNode] | None = None,
    ) -> dict[str, Refusal | None]:
        """Admit or hold each node's action. `fresh`: a state of these nodes read right now
        (a single-node action reads it), used instead of the tick's listing for them."""
        w = self.world(now, before_action)
        if fresh is not None and w.nodes is not None:
            w = replace(w, nodes={**w.nodes, **fresh})
        out = decide_admission(act, nodes, w, self.limits, switch_incident)
        for n, r in out.items():
            if r is not None:
                self._count(act, n, r)
        return out

    def one(self, act: Act, node: str, now: datetime) -> Refusal | None:
        """One node's reboot, reset or validation, on its state read from Slurm right now
        (an admin may have drained it since the tick's listing)."""
        try:
            fresh = self.slurm.node(node)
        except (SlurmError, NotImplementedError) as exc:
            why = f"state unknown: cannot read {node} from Slurm ({exc})"
            return self._count(act, node, Refusal(Why.UNKNOWN, why))
        return self.check(act, [node], now, fresh={node: fresh})[node]

    def _count(self, act: Act, node: str, r: Refusal) -> Refusal:
        # a held action is asked on every tick: logged when its hold starts or its reason changes
        said = (self.refused.get(node) or self.before.get(node)) == r
        self.refused[node] = r
        self.refusals.labels(str(r.why), str(act)).inc()
        log.log(logging.DEBUG if said else logging.INFO, "%s %s held: %s", act, node, r.reason)
        return r

    def alerts(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        """One alert for what this tick held (cleared on a tick that held nothing)."""
        held, self.refused = self.refused, {}
        self.before = held  # a hold asked again next tick is not logged again
        if not held:
            clearing.append((None, CONDITION))
            return
        caps = sorted({r.reason for r in held.values() if r.why.value.startswith("cap")})
        rest = sorted({r.reason for r in held.values() if not r.why.value.startswith("cap")})
        names = sorted(held)
        firing.append(
            Alert(
                None,
                CONDITION,
                Severity.CRITICAL if caps else Severity.WARNING,
                f"{len(names)} automatic action(s) held: " + "; ".join([*caps, *rest][:6]),
                "held, not failed: asked again when there is room or the count is known",
                now,
                nodes=names,
                details={n: str(r) for n, r in sorted(held.items())[:50]},
            )
        )
