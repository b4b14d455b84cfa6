"""Slurm's view of the network: which switch (or block) each node hangs off, from
`scontrol show topology`, which every supported version prints the same way:

- topology/tree (all versions): one line per switch, `SwitchName=leaf1 Level=0 LinkSpeed=1
  Nodes=node[1-4]`; upper switches also list every node below them and their child
  switches (`SwitchName=spine Level=1 ... Nodes=node[1-8] Switches=leaf[1-2]`).
- topology/block (23.11+): `BlockName=b1 BlockIndex=0 Nodes=node[1-4] BlockSize=4`; a block
  is a leaf here (the nodes of one block share the fast fabric).
- topology.yaml (25.05+) may define several topologies; lines then carry `Topology=NAME` and
  the first one named (Slurm prints the cluster default first) is used.

The text is Slurm's, not a user's, but it is parsed defensively all the same: a line that
cannot be read is skipped and counted, never fatal."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from babysitter.slurm.hostlist import expand

_TOKEN = re.compile(r"(\w+)=(\S*)")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
NO_TOPOLOGY = "no topology information available"


@dataclass(frozen=True)
class Switch:
    name: str
    level: int  # 0 = leaf (a block is a leaf too)
    nodes: frozenset[str]  # every node below it, at any depth
    children: tuple[str, ...] = ()  # child switches


@dataclass(frozen=True)
class Topology:
    """Switches by name, and for each node the chain of switches above it, leaf first."""

    switches: Mapping[str, Switch] = field(default_factory=lambda: MappingProxyType({}))
    kind: str = ""  # "tree", "block" or "" (no topology)
    skipped: int = 0  # lines that could not be read

    def __post_init__(self) -> None:
        parents: dict[str, str] = {}
        for sw in self.switches.values():
            for child in sw.children:
                parents.setdefault(child, sw.name)
        chains: dict[str, tuple[str, ...]] = {}
        leaves = sorted((s for s in self.switches.values() if s.level == 0), key=lambda s: s.name)
        for leaf in leaves:
            chain = [leaf.name]
            while (up := parents.get(chain[-1])) is not None and up not in chain:
                chain.append(up)
            for node in leaf.nodes:
                chains.setdefault(node, tuple(chain))
        object.__setattr__(self, "_chains", MappingProxyType(chains))

    @property
    def known(self) -> bool:
        return bool(self.switches)

    def chain(self, node: str) -> tuple[str, ...]:
        """The switches above `node`, leaf first; () for a node Slurm puts under none."""
        chains: Mapping[str, tuple[str, ...]] = object.__getattribute__(self, "_chains")
        return chains.get(node, ())

    def leaf(self, node: str) -> str | None:
        c = self.chain(node)
        return c[0] if c else None

    def size(self, switch: str) -> int:
        sw = self.switches.get(switch)
        return len(sw.nodes) if sw else 0

    def summary(self) -> dict[str, object]:
        """For the API and `babysitter guard`: what Slurm told us, in numbers."""
        return {
            "kind": self.kind or "none",
            "switches": len(self.switches),
            "leaves": sum(1 for s in self.switches.values() if s.level == 0),
            "nodes": len(object.__getattribute__(self, "_chains")),
        }


def _names(expr: str) -> list[str]:
    return [n for n in expand(expr) if _NAME.match(n)] if expr else []


def parse_topology(text: str) -> Topology:
    """`scontrol show topology` output -> Topology (empty when Slurm has none)."""
    if NO_TOPOLOGY in text.lower():
        return Topology()
    first_topology: str | None = None
    switches: dict[str, Switch] = {}
    kind = ""
    skipped = 0
    for line in text.splitlines():
        tokens = dict(_TOKEN.findall(line))
        if not tokens:
            continue
        topo = tokens.get("Topology")
        if topo is not None:
            first_topology = first_topology or topo
            if topo != first_topology:
                continue
        try:
            if "SwitchName" in tokens:
                name = tokens["SwitchName"]
                level = int(tokens.get("Level", "0"))
                children = tuple(_names(tokens.get("Switches", "")))
                kind = "tree"
            elif "BlockName" in tokens:
                name, level, children, kind = tokens["BlockName"], 0, (), "block"
            else:
                continue
            if not _NAME.match(name):
                raise ValueError(f"bad switch name {name!r}")
            # an upper switch's Nodes= repeats every node below it: taken from its children
            # instead (half the names to expand on a two-level tree)
            nodes = frozenset() if children else frozenset(_names(tokens.get("Nodes", "")))
            switches[name] = Switch(name, level, nodes, children)
        except ValueError:
            skipped += 1
    for sw in sorted(switches.values(), key=lambda s: s.level):
        if sw.children:
            below = [switches[c].nodes for c in sw.children if c in switches]
            switches[sw.name] = Switch(sw.name, sw.level, frozenset().union(*below), sw.children)
    return Topology(MappingProxyType(switches), kind, skipped)


def tree(leaves: Mapping[str, Iterable[str]], spine: str = "spine") -> Topology:
    """A two-level tree (leaves under one spine), for tests, benchmarks and devcluster."""
    sw = {name: Switch(name, 0, frozenset(nodes)) for name, nodes in leaves.items()}
    every = frozenset(n for s in sw.values() for n in s.nodes)
    sw[spine] = Switch(spine, 1, every, tuple(sorted(leaves)))
    return Topology(MappingProxyType(sw), "tree")
