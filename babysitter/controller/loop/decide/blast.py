"""Blast radius in layers, as pure policy: caps on how many nodes babysitter holds drained per
leaf switch, per partition and cluster-wide, each a fraction of the scope and an absolute count
(the limit is the smaller, never below 1 so a scope's first fault is always drained).

A tripped cap stops new node drains in its scope only: a partition over its cap keeps its
remaining nodes in service while other partitions still drain theirs; resumes never pass
through here. This gate is the decision-time filter of the node policy; the same caps are
enforced right before every drain by the admission step (controller/loop/admit/admission.py), which
also holds a switch incident's drains at its partition's and the cluster's caps. The
cluster-wide breaker of policy.py (rate budget, [policy] max_drained_fraction) stays behind
these as the last resort.

The gate is asked once per wanted drain, in the policy's order (most severe first); it counts
what it admits, so two faults in one tick cannot both squeeze under a cap of one."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from babysitter.config import Config


class Scope(StrEnum):
    SWITCH = "switch"
    DOMAIN = "domain"  # an NVLink domain (controller/loop/fabric/nvlink_domain.py)
    PARTITION = "partition"
    CLUSTER = "cluster"


CLUSTER = "cluster"  # the cluster scope's one name


@dataclass(frozen=True)
class Cap:
    fraction: float | None = None
    count: int | None = None

    @property
    def active(self) -> bool:
        return self.fraction is not None or self.count is not None

    def limit(self, size: int) -> int:
        """Nodes of a scope of `size` babysitter may hold drained."""
        limits = [self.count] if self.count is not None else []
        if self.fraction is not None:
            limits.append(math.floor(self.fraction * size))
        return max(1, min(limits)) if limits else size


@dataclass(frozen=True)
class BlastSettings:
    switch: Cap = Cap()
    partition: Cap = Cap()
    cluster: Cap = Cap()
    domain: Cap = Cap()  # enforced by the admission step only (it knows the domains)

    @classmethod
    def from_config(cls, cfg: Config) -> BlastSettings:
        b = cfg.blast_radius
        return cls(
            Cap(b.switch_fraction, b.switch_count),
            Cap(b.partition_fraction, b.partition_count),
            Cap(b.cluster_fraction, b.cluster_count),
            Cap(b.domain_fraction, b.domain_count),
        )

    @property
    def active(self) -> bool:
        return self.switch.active or self.partition.active or self.cluster.active

    def cap(self, scope: Scope) -> Cap:
        caps = {
            Scope.SWITCH: self.switch,
            Scope.PARTITION: self.partition,
            Scope.DOMAIN: self.domain,
        }
        return caps.get(scope, self.cluster)


@dataclass(frozen=True)
class ScopeCounts:
    """Sizes and babysitter-drained counts per scope: drains done and pending, a switch
    incident's included (its nodes are out of service like any other)."""

    sizes: Mapping[tuple[Scope, str], int]
    drained: Mapping[tuple[Scope, str], int]


@dataclass
class Trip:
    scope: Scope
    name: str
    size: int
    drained: int
    limit: int
    blocked: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        return (
            f"{self.scope} {self.name}: {self.drained} of {self.size} node(s) held drained by "
            f"babysitter, cap {self.limit}; not drained: {', '.join(self.blocked[:10])}"
            + ("…" if len(self.blocked) > 10 else "")
        )

    def public(self) -> dict[str, object]:
        return {
            "scope": str(self.scope),
            "name": self.name,
            "size": self.size,
            "drained": self.drained,
            "limit": self.limit,
            "blocked": list(self.blocked),
            "reason": self.reason,
        }


class BlastGate:
    """Admits or refuses each new node drain of one policy decision."""

    def __init__(self, s: BlastSettings, counts: ScopeCounts) -> None:
        self.s = s
        self.sizes = counts.sizes
        self.drained = dict(counts.drained)
        self.trips: dict[tuple[Scope, str], Trip] = {}

    def admit(self, node: str, leaf: str | None, partitions: Sequence[str]) -> bool:
        scopes: list[tuple[Scope, str]] = []
        if leaf is not None and self.s.switch.active:
            scopes.append((Scope.SWITCH, leaf))
        if self.s.partition.active:
            scopes += [(Scope.PARTITION, p) for p in partitions]
        if self.s.cluster.active:
            scopes.append((Scope.CLUSTER, CLUSTER))
        over = None
        for key in scopes:
            size = self.sizes.get(key)
            if size is None:  # a scope of unknown size is not capped (policy.py holds those)
                continue
            limit = self.s.cap(key[0]).limit(size)
            if self.drained.get(key, 0) + 1 > limit:
                over = key
                trip = self.trips.setdefault(
                    key, Trip(key[0], key[1], size, self.drained.get(key, 0), limit)
                )
                trip.blocked.append(node)
                break
        if over is not None:
            return False
        for key in scopes:
            self.drained[key] = self.drained.get(key, 0) + 1
        return True

    def tripped(self) -> list[Trip]:
        order = list(Scope)  # narrowest scope first
        return sorted(self.trips.values(), key=lambda t: (order.index(t.scope), t.name))
