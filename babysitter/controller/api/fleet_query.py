"""A fleet page's filters (verdict, partition, switch, NVLink domain, owner, a name or a Slurm
hostlist) applied to the published snapshot, and the rows of the page shown."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from babysitter.controller.api.fleet_snapshot import (
    NO_PARTITION,
    FleetSnapshot,
    NodeRow,
    Place,
    plain_row,
)


@dataclass
class Query:
    """A fleet page's filters, from its query string."""

    verdict: str = ""  # "" = needs a human; a verdict; "drained"; "all"
    partition: str = ""
    switch: str = ""
    domain: str = ""
    owner: str = ""
    q: str = ""  # a node name (substring) or a Slurm hostlist
    page: int = 1
    errors: list[str] = field(default_factory=list)


PAGE_SIZE = 100


def select_nodes(snap: FleetSnapshot, query: Query) -> list[NodeRow | str]:
    """The nodes a page lists, each once (a node in several partitions is one row): a NodeRow
    for a node that needs a human, the name of a healthy one (rows(): only for the page shown,
    there may be 10,000 of them)."""
    from babysitter.slurm.hostlist import expand

    wanted: set[str] | None = None
    needle = query.q.strip()
    if needle and any(ch in needle for ch in "[],"):
        try:
            if hostlist_size(needle) > MAX_SEARCH_NAMES:
                raise ValueError(f"more than {MAX_SEARCH_NAMES} names")
            wanted = set(expand(needle))
        except (ValueError, IndexError) as exc:
            query.errors.append(f"not a Slurm hostlist: {exc}")
            wanted = set()
    low = needle.lower()

    def named(name: str) -> bool:
        if wanted is not None:
            return name in wanted
        return not needle or low in name.lower()

    def placed(p: Place) -> bool:
        return (
            (not query.partition or query.partition in p.partitions)
            and (not query.switch or p.switch == query.switch)
            and (not query.domain or p.domain == query.domain)
        )

    def keep(r: NodeRow) -> bool:
        if query.verdict == "drained":
            if not r.drained:
                return False
        elif query.verdict not in ("", "all") and r.verdict != query.verdict:
            return False
        if query.owner and r.owner != query.owner:
            return False
        return placed(r.place) and named(r.name)

    out: list[NodeRow | str] = [r for r in snap.needs_human if keep(r)]
    # healthy nodes are listed when asked for: by verdict, or by name (a search shows a node
    # whatever its verdict); a healthy node is held by nobody and not drained
    healthy_too = query.verdict in ("healthy", "all") or (bool(needle) and not query.verdict)
    if healthy_too and query.owner in ("", "none"):
        places = snap.places
        none = Place((NO_PARTITION,), None, None)
        out += [n for n in snap.healthy if named(n) and placed(places.get(n) or none)]
    return out


MAX_SEARCH_NAMES = 100_000  # a search's hostlist names at most this many nodes
_BRACKETS = re.compile(r"\[([^\]]*)\]")
_SPAN = re.compile(r"^\s*(\d+)(?:-(\d+))?\s*$")


def hostlist_size(expr: str) -> int:
    """How many names a hostlist expands to, counted without expanding it (a viewer's search
    must not make the controller list millions of names); malformed parts count as one."""
    total, depth = 0, 0
    item: list[str] = []
    for ch in [*expr, ","]:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth <= 0:
            size = 1
            for body in _BRACKETS.findall("".join(item)):
                spans = [_SPAN.match(r) for r in body.split(",")]
                # a backwards range ([5-3]) is malformed: one, never a negative count that
                # would hide a huge item elsewhere in the search
                size *= sum(max(1, int(m[2] or m[1]) - int(m[1]) + 1) if m else 1 for m in spans)
            total += size
            item = []
        else:
            item.append(ch)
    return total


def rows(snap: FleetSnapshot, items: list[NodeRow | str]) -> list[NodeRow]:
    return [i if isinstance(i, NodeRow) else _healthy_row(snap, i) for i in items]


def _healthy_row(snap: FleetSnapshot, name: str) -> NodeRow:
    return plain_row(snap, name, "healthy", "")
