"""The blast-radius guard over one tick's drain wishes: the hourly budget and each partition's
share of drained nodes, in a deterministic order (the most severe nodes first, then by name)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from babysitter.controller.loop.decide.node.decisions import Decision, DecisionKind
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.node.rules import NoRule, Rule
from babysitter.controller.loop.decide.node.wording import listed
from babysitter.finding import Severity


def drain_limit(size: int, s: PolicySettings) -> float:
    """Nodes of a partition of `size` babysitter may hold drained (`drained_cap`)."""
    return drained_cap(size, s.min_drainable, s.max_drained_fraction)


def drained_cap(size: int, min_drainable: int, max_drained_fraction: float) -> float:
    """Nodes of a partition of `size` babysitter may hold drained: the fraction, but never
    fewer than min_drainable (so the first fault in a small partition is drained). The one
    rule for the policy's guard and the admission step's cap."""
    return max(float(min_drainable), max_drained_fraction * size)


@dataclass(frozen=True)
class DrainWish:
    """A node the policy would drain, before the blast-radius guard has had its say."""

    worst: int  # rank of its worst drain-worthy finding: the worst nodes are drained first
    node: NodeFacts
    rule: Rule | NoRule
    why: str


@dataclass
class Guard:
    """The blast-radius guard over one tick's drain wishes: it admits drains in order until
    the hourly budget or a partition's share would be exceeded, then trips and holds the rest.
    Starts from the cluster's counts (drains already done, a breaker tripped earlier)."""

    cluster: ClusterFacts
    s: PolicySettings
    tripped: bool = False
    rule: Rule | NoRule = ""
    drained: dict[str, int] = field(default_factory=dict)
    drains_hour: int = 0
    blocked: list[str] = field(default_factory=list)
    unsized: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tripped = self.cluster.guard_tripped
        self.rule = Rule.GUARD_TRIPPED if self.tripped else ""
        self.drained = dict(self.cluster.drained_by_us)
        self.drains_hour = self.cluster.drains_last_hour

    def drains(
        self, wishes: list[DrainWish], admit: Callable[[NodeFacts], bool] | None
    ) -> list[Decision]:
        """The drains the guard admits: the most severe nodes first, then by name."""
        out: list[Decision] = []
        for w in sorted(wishes, key=lambda w: (-w.worst, w.node.name)):
            n = w.node
            if any(p not in self.cluster.partition_sizes for p in n.partitions):
                # never trip on a size we do not know: hold the drain and say so
                self.unsized.append(n.name)
                continue
            if admit is not None and not admit(n):
                continue
            if not self.tripped and (over := self._over(n)):
                self.tripped, self.rule = True, over
            if self.tripped:
                self.blocked.append(n.name)
                continue
            out.append(
                Decision(
                    DecisionKind.DRAIN,
                    n.name,
                    w.rule,
                    w.why,
                    Severity.CRITICAL,
                    "node_unhealthy",
                    dry_run=self.s.dry_run,
                )
            )
            self.drains_hour += 1
            for p in n.partitions:
                self.drained[p] = self.drained.get(p, 0) + 1
        return out

    def _over(self, n: NodeFacts) -> Rule | None:
        """The limit one more drain of `n` would exceed, if any."""
        if self.drains_hour + 1 > self.s.max_drains_per_hour:
            return Rule.GUARD_RATE
        sizes = self.cluster.partition_sizes
        if any(self.drained.get(p, 0) + 1 > drain_limit(sizes[p], self.s) for p in n.partitions):
            return Rule.GUARD_FRACTION
        return None

    def alerts(self) -> list[Decision]:
        """What the guard says: tripped earlier, tripped now (naming the held nodes), or
        holding drains because partition sizes are unknown."""
        s, out = self.s, []
        if self.tripped and not self.blocked:
            out.append(
                Decision(
                    DecisionKind.KEEP_ALERT,
                    None,
                    Rule.GUARD_TRIPPED,
                    "blast-radius guard tripped earlier: drains stay stopped until an admin reset",
                    Severity.CRITICAL,
                    "guard_tripped",
                )
            )
        if self.blocked:
            out.append(
                Decision(
                    DecisionKind.GUARD_TRIPPED,
                    None,
                    self.rule,
                    f"blast-radius guard: {len(self.blocked)} unhealthy node(s) NOT drained "
                    f"({listed(self.blocked)}); "
                    f"limits: {s.max_drained_fraction:.0%} of a partition (at least "
                    f"{s.min_drainable} node(s)), {s.max_drains_per_hour}/h",
                    Severity.CRITICAL,
                    "guard_tripped",
                    details={"blocked": self.blocked},
                )
            )
        if not self.unsized:
            return [
                *out,
                Decision(DecisionKind.RESOLVE_ALERT, None, "", "", condition="guard_sizes_unknown"),
            ]
        out.append(
            Decision(
                DecisionKind.ALERT,
                None,
                Rule.GUARD_UNKNOWN,
                f"{len(self.unsized)} unhealthy node(s) NOT drained ({listed(self.unsized)}): "
                "partition sizes unknown (no Slurm data yet); babysitter decides once Slurm "
                "answers",
                Severity.CRITICAL,
                "guard_sizes_unknown",
                details={"blocked": self.unsized},
            )
        )
        return out
