"""Fabric correlation, as pure policy: when the nodes under one switch report fabric trouble
together, the switch is the suspect, not each node.

A leaf switch that fails takes every port below it down within seconds; judged node by node,
that is a drain and a page per node until the blast-radius guard trips. Here, fabric findings
(InfiniBand port down/degraded/flapping, link-down counters, as the node's agent reads them from
sysfs) whose onsets
fall within `window_s` on at least `threshold(size)` nodes of one leaf become one
`switch_suspected` incident. Leaves suspected in the same tick under one upper switch merge
into one incident for that switch.

So that the first node of a failing switch is not drained and paged on its own before its
siblings report, a node's fabric findings are held back from the node policy for `hold_s`
after their onset; a switch incident is decided once its first onset is `hold_s` old (or every
node under the switch has reported). A node whose fabric fault stays alone is an ordinary node
fault `hold_s` later than it would be without correlation.

Only the node's own readings are evidence: a job-owned finding (`finding.job_owned`: an NCCL
transport error a job printed into its log, which any user can write) never opens, joins or holds
an incident; it stays the job's alert (docs/policy.md "Trust of finding sources").

Cost: proportional to the nodes with fabric findings, never to the size of the tree (the
topology maps each node to its switches once, when it is read).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from babysitter.finding import Finding, Severity, job_owned
from babysitter.slurm.topology import Topology

if TYPE_CHECKING:
    from babysitter.config import Config

# the findings that say "this node's link to the fabric is bad" (checks/infiniband/);
# ib.missing (no device at all) is the node's own fault. NCCL's transport errors are read from
# a job's log (job-owned): the job's, never the fabric's
FABRIC_CODES = frozenset(
    {
        "ib.port_down",
        "ib.port_flapping",
        "ib.rate_degraded",
        "ib.link_downed",
        "ib.link_error_recovery",
        "ib.symbol_error",
    }
)


class SwitchAction(StrEnum):
    """What becomes of the nodes under a suspected switch."""

    DRAIN = "drain"  # drained together, reason `babysitter: switch <name> suspected`
    KEEP = "keep"  # left in service: one alert, babysat jobs requeued elsewhere


def is_fabric(f: Finding) -> bool:
    """Evidence against the node's link: its own reading, never one a job owner can write
    (whatever its code says)."""
    return f.code in FABRIC_CODES and f.severity >= Severity.WARNING and not job_owned(f)


def switch_reason(switch: str) -> str:
    """The drain reason (after the prefix): the form DESIGN.md fixes."""
    return f"switch {switch} suspected"


@dataclass(frozen=True)
class FabricSettings:
    min_nodes: int = 3
    min_fraction: float = 0.5
    window_s: float = 60.0
    hold_s: float = 10.0
    clean_reports: int = 3  # clean reports from every node before the switch is trusted again
    action: SwitchAction = SwitchAction.DRAIN

    @classmethod
    def from_config(cls, cfg: Config) -> FabricSettings:
        f = cfg.fabric
        return cls(
            min_nodes=f.min_nodes,
            min_fraction=f.min_fraction,
            window_s=f.window_s,
            hold_s=f.hold_s,
            clean_reports=cfg.policy.resume_after_clean_checks,
            action=SwitchAction(f.on_switch),
        )

    def threshold(self, size: int) -> int:
        """Nodes of a switch of `size` that must report together: min_nodes or
        min_fraction of the switch, whichever is smaller, never fewer than 2 (one node alone
        is a node fault)."""
        return max(2, min(self.min_nodes, math.ceil(self.min_fraction * size)))


_LID = re.compile(r"^0x[0-9a-f]{1,4}$")


@dataclass(frozen=True)
class Evidence:
    node: str
    since: datetime  # onset: when the controller first saw a fabric finding of the node
    codes: tuple[str, ...] = ()
    ports: tuple[str, ...] = ()  # the node's ports in trouble (components: ib:mlx5_0/1)
    sm_lids: tuple[str, ...] = ()  # subnet manager LIDs its agent read from sysfs


@dataclass(frozen=True)
class Incident:
    switch: str
    level: int
    nodes: frozenset[str]  # nodes that reported (the ones drained / requeued away from)
    opened_at: datetime
    jobs: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "switch": self.switch,
            "level": self.level,
            "nodes": sorted(self.nodes),
            "opened_at": self.opened_at.isoformat(),
            "jobs": list(self.jobs),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Incident:
        return cls(
            switch=str(d["switch"]),
            level=int(d.get("level", 0)),
            nodes=frozenset(str(n) for n in d.get("nodes", [])),
            opened_at=datetime.fromisoformat(str(d["opened_at"])),
            jobs=tuple(int(j) for j in d.get("jobs", [])),
        )


@dataclass(frozen=True)
class FabricView:
    open: tuple[Incident, ...]  # incidents open after this decision (new ones included)
    opened: tuple[Incident, ...] = ()  # new this decision
    joined: Mapping[str, frozenset[str]] = field(default_factory=dict)  # switch -> new nodes
    resolved: tuple[Incident, ...] = ()
    held: frozenset[str] = frozenset()  # fabric findings hidden from the node policy
    covered: frozenset[str] = frozenset()  # nodes an open incident answers for


def onsets(
    findings: Mapping[str, Sequence[Finding]],
    previous: Mapping[str, Evidence],
    now: datetime,
    fault: Callable[[Finding], bool] = is_fabric,
) -> dict[str, Evidence]:
    """Each node's evidence (its findings `fault` picks; the switch's by default): its onset
    carried over while the trouble lasts, `now` for a node that just started; nodes without
    such findings drop out."""
    out: dict[str, Evidence] = {}
    for node, fs in findings.items():
        mine = [f for f in fs if fault(f)]
        if mine:
            prev = previous.get(node)
            out[node] = Evidence(
                node,
                prev.since if prev else now,
                tuple(sorted({f.code for f in mine})),
                tuple(sorted({f.component for f in mine if f.component.startswith("ib:")})),
                # an agent's word, shown to people: only well-formed LIDs
                tuple(sorted({v for f in mine if _LID.match(v := str(f.details.get("sm_lid")))})),
            )
    return out


def _densest(times: list[tuple[datetime, str]], window: timedelta) -> list[tuple[datetime, str]]:
    """The largest run of onsets (sorted) that fits in one window; the latest run on ties."""
    best: list[tuple[datetime, str]] = []
    lo = 0
    for hi in range(len(times)):
        while times[hi][0] - times[lo][0] > window:
            lo += 1
        if hi - lo + 1 >= len(best):
            best = times[lo : hi + 1]
    return best


@dataclass(frozen=True)
class _Carried:
    """What became of the incidents open before this decision."""

    still: tuple[Incident, ...]
    resolved: tuple[Incident, ...]
    joined: Mapping[str, frozenset[str]]  # switch -> its new nodes
    covered: frozenset[str]  # the nodes of the ones still open


def correlate(
    topology: Topology,
    evidence: Mapping[str, Evidence],
    incidents: Iterable[Incident],
    clean: Mapping[str, int],
    s: FabricSettings,
    now: datetime,
) -> FabricView:
    """One decision: open incidents grow, resolve or stay; new ones open; and the nodes whose
    fabric findings the node policy must not see (held, or covered by an incident).

    `clean`: consecutive clean reports of the nodes the node policy looked at this tick; a
    node it did not look at is healthy and reporting (controller/loop/read/facts.py), so clean."""
    carried = _carry_over(topology, evidence, incidents, clean, s.clean_reports)
    by_leaf = _unclaimed_by_leaf(topology, evidence, carried)
    ready, held = _suspects(topology, by_leaf, s, now)
    opened = _merge_up(topology, ready, now)
    covered = carried.covered.union(*(inc.nodes for inc in opened))
    return FabricView(
        open=(*carried.still, *opened),
        opened=tuple(opened),
        joined=carried.joined,
        resolved=carried.resolved,
        held=frozenset(held - covered),
        covered=covered,
    )


def _carry_over(
    topology: Topology,
    evidence: Mapping[str, Evidence],
    incidents: Iterable[Incident],
    clean: Mapping[str, int],
    enough: int,
) -> _Carried:
    """Each open incident takes in the new troubled nodes below its switch, or resolves once
    none of its nodes is troubled and every one has reported clean `enough` times."""
    still: list[Incident] = []
    resolved: list[Incident] = []
    joined: dict[str, frozenset[str]] = {}
    covered: set[str] = set()
    for inc in incidents:
        sw = topology.switches.get(inc.switch)
        below = sw.nodes if sw is not None else inc.nodes
        new = frozenset(n for n in evidence if n in below and n not in inc.nodes)
        nodes = inc.nodes | new
        troubled = any(n in evidence for n in nodes)
        if not troubled and all(clean.get(n, enough) >= enough for n in nodes):
            resolved.append(inc)
            continue
        if new:
            joined[inc.switch] = new
            inc = Incident(inc.switch, inc.level, nodes, inc.opened_at, inc.jobs)
        still.append(inc)
        covered |= nodes
    return _Carried(tuple(still), tuple(resolved), joined, frozenset(covered))


def _unclaimed_by_leaf(
    topology: Topology, evidence: Mapping[str, Evidence], carried: _Carried
) -> dict[str, list[tuple[datetime, str]]]:
    """The onsets of the troubled nodes no open incident claims, by leaf switch."""
    # the nodes of a switch already under suspicion belong to it, not to a new incident
    suspect_below = {
        n
        for inc in carried.still
        if (sw := topology.switches.get(inc.switch)) is not None
        for n in sw.nodes & evidence.keys()
    }
    by_leaf: dict[str, list[tuple[datetime, str]]] = {}
    for node, ev in evidence.items():
        if node in carried.covered or node in suspect_below:
            continue
        leaf = topology.leaf(node)
        if leaf is not None:
            by_leaf.setdefault(leaf, []).append((ev.since, node))
    return by_leaf


def _suspects(
    topology: Topology,
    by_leaf: Mapping[str, list[tuple[datetime, str]]],
    s: FabricSettings,
    now: datetime,
) -> tuple[dict[str, frozenset[str]], set[str]]:
    """The leaves whose troubled nodes are a switch incident now (-> those nodes), and the
    nodes held back from the node policy while their siblings may still report."""
    hold = timedelta(seconds=s.hold_s)
    window = timedelta(seconds=s.window_s)
    held: set[str] = set()
    ready: dict[str, frozenset[str]] = {}
    for leaf, times in by_leaf.items():
        size = topology.size(leaf)
        need = s.threshold(size)
        if need > size:  # a switch of one node: nothing to correlate
            continue
        times.sort()
        run = _densest(times, window)
        members = frozenset(n for _, n in run)
        if len(run) >= need and (run[0][0] + hold <= now or len(run) == size):
            ready[leaf] = members
            continue
        # not (yet) a switch: the ones still within their hold wait for their siblings
        held.update(n for t, n in times if t + hold > now)
        if len(run) >= need:
            held |= members
    return ready, held


def _merge_up(
    topology: Topology, ready: Mapping[str, frozenset[str]], now: datetime
) -> list[Incident]:
    """Leaves suspected together under one upper switch are that switch's incident: a spine
    (or a leaf pair's uplink) failing shows on every leaf below it at once."""
    groups: dict[str, frozenset[str]] = dict(ready)
    level = 0
    while True:
        parents: dict[str, list[str]] = {}
        for name in groups:
            chain = _chain_of(topology, name)
            if len(chain) > level + 1:
                parents.setdefault(chain[level + 1], []).append(name)
        merged = {p: kids for p, kids in parents.items() if len(kids) >= 2}
        if not merged:
            break
        for parent, kids in merged.items():
            nodes = frozenset().union(*(groups.pop(k) for k in kids))
            groups[parent] = nodes
        level += 1
    return [
        Incident(
            name,
            topology.switches[name].level if name in topology.switches else 0,
            nodes,
            now,
        )
        for name, nodes in sorted(groups.items())
    ]


def _chain_of(topology: Topology, switch: str) -> tuple[str, ...]:
    """The chain of any node below `switch` (all nodes of a leaf share it), from the leaf."""
    sw = topology.switches.get(switch)
    if sw is None or not sw.nodes:
        return ()
    return topology.chain(min(sw.nodes))
