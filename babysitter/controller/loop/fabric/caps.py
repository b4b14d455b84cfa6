"""The blast-radius caps around the fabric step (controller/loop/decide/blast.py decides them):
how many nodes babysitter holds out of each scope (partition, cluster, leaf switch), the alert
while a cap holds drains back, its audit entries, and what `babysitter guard` shows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from babysitter.controller.db import audit
from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import pending_drain_nodes
from babysitter.controller.loop.decide.blast import CLUSTER, BlastSettings, Scope, ScopeCounts, Trip
from babysitter.controller.loop.decide.fabric import Incident
from babysitter.controller.loop.decide.node.facts_model import ClusterFacts
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.read.snapshot import SlurmSnapshot
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Severity
from babysitter.slurm.ownership import BABYSITTER_WRITTEN, reason_owner
from babysitter.slurm.topology import Topology

CAP_CONDITION = "blast_radius_cap"


def held_by_incidents(
    snapshot: SlurmSnapshot, owned: Callable[[str], bool]
) -> dict[str, tuple[str, ...]]:
    """Nodes Slurm holds drained with a reason `owned` names (a switch incident's) -> their
    partitions."""
    out = {}
    for name in snapshot.held:
        sn = snapshot.nodes.get(name)
        if sn is not None and sn.drained_or_draining and owned(sn.reason):
            out[name] = sn.partitions or ("default",)
    return out


def drained_without(cluster: ClusterFacts, held: dict[str, tuple[str, ...]]) -> dict[str, int]:
    """The guard's per-partition drain counts less the nodes in `held`."""
    per = Counter(p for parts in held.values() for p in parts)
    return {p: max(0, n - per.get(p, 0)) for p, n in cluster.drained_by_us.items()}


def scope_counts(
    snapshot: SlurmSnapshot, store: Store, prefix: str, blast: BlastSettings, topo: Topology
) -> ScopeCounts:
    """Sizes and node-drain counts of every scope (switch drains and pending drains
    included). Sizes of partitions and the cluster come from the snapshot's aggregates,
    switch sizes from the topology; the drained count walks only the nodes Slurm holds (a
    few, not the cluster)."""
    sizes: dict[tuple[Scope, str], int] = {
        (Scope.PARTITION, p): n for p, n in snapshot.partitions.items()
    }
    if snapshot.nodes:
        sizes[(Scope.CLUSTER, CLUSTER)] = len(snapshot.nodes)
    drained: Counter[tuple[Scope, str]] = Counter()
    # drains decided but not carried out yet count as held: they will be
    pending = pending_drain_nodes(store)  # every one, counted in the database
    for name in snapshot.held | pending:
        sn = snapshot.nodes.get(name)
        if sn is None:  # a switch incident's drains count too: nodes out of service
            continue
        # every drain babysitter wrote counts against the caps (the safe side)
        written = reason_owner(sn.reason, prefix) in BABYSITTER_WRITTEN
        mine = sn.drained_or_draining and written
        if not mine and name not in pending:
            continue
        drained[(Scope.CLUSTER, CLUSTER)] += 1
        for p in sn.partitions or ("default",):
            drained[(Scope.PARTITION, p)] += 1
        if (leaf := topo.leaf(name)) is not None:
            drained[(Scope.SWITCH, leaf)] += 1
    if blast.switch.active:
        for sw in topo.switches.values():
            if sw.level == 0:
                sizes[(Scope.SWITCH, sw.name)] = len(sw.nodes)
    return ScopeCounts(sizes, drained)


def held_back_entries(
    store: Store, reasons: dict[str, str], nodes: Iterable[str], now: datetime
) -> list[audit.AuditEntry]:
    """One audit entry per node a cap held back (`reasons`: node -> the cap's reason)."""
    return [
        audit.AuditEntry(
            kind="drain",
            actor=str(audit.Actor.POLICY),
            result=audit.AuditResult.SKIPPED,
            node=n,
            rule=Rule.BLAST_RADIUS_CAP,
            outcome=f"held by the node-drain cap: {reasons[n]}",
            evidence=audit.evidence(store, [n]).get(n, []),
            at=now,
        )
        for n in nodes
    ]


def cap_alert(trips: Sequence[Trip], now: datetime) -> Alert:
    """The cluster's alert while a cap holds drains back (`trips`: blast.py's tripped caps)."""
    return Alert(
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


def guard_info(
    blast: BlastSettings, trips: Sequence[Trip], incidents: Iterable[Incident], topo: Topology
) -> dict[str, Any]:
    """What `babysitter guard` and GET /api/v1/guard show."""
    return {
        "caps": {
            str(scope): {
                "fraction": blast.cap(scope).fraction,
                "count": blast.cap(scope).count,
            }
            for scope in Scope
            if blast.cap(scope).active
        },
        "tripped": [t.public() for t in trips],
        "switch_incidents": [i.to_json() for i in incidents],
        "topology": topo.summary(),
    }
