"""The fleet as the status page shows it: one immutable snapshot, built once per loop tick and
published by swapping one reference, so that a page request only reads it (no request walks the
node rows, and a request is served while a tick runs).

A build reads every node's name (one narrow column) and decodes the full row only of the nodes
that may need a human: open findings, a verdict other than healthy, drained by babysitter or in
Slurm, silent past the heartbeat timeout (the same filter as the policy tick's,
controller/db/tickstore.py). Every other node is healthy and only counted, per partition, leaf
switch and NVLink domain. A store that cannot be read makes every node `unknown` (never healthy)
with the error said on the page.

The snapshot's shape is fleet_snapshot.py's; a page's filters are fleet_query.py's."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, true

from babysitter.controller.api.api_read import node_view
from babysitter.controller.api.fleet_snapshot import (
    NO_PARTITION,
    VERDICTS,
    FleetSnapshot,
    NodeRow,
    Place,
    empty_snapshot,
    plain_row,
)
from babysitter.controller.db import audit
from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store, aware, now, stored_finding
from babysitter.controller.loop.admit import maintenance
from babysitter.controller.loop.read.guard import guard_view
from babysitter.slurm import ownership
from babysitter.slurm.ownership import ReasonOwner

log = logging.getLogger(__name__)

PROBLEM_CHARS = 120  # a finding's message on a tile: the whole text is on the node's page
MAX_ALERTS = 50  # firing alerts kept in a snapshot (the rest are counted)
MAX_JOBS = 50
SLURM_HELD = ("DRAIN", "DOWN", "FAIL")
# every node's name is re-read at least this often (else only when their number changed: a
# node deleted and another first seen between two builds show from the next full read)
NAMES_S = 60.0

# name -> the Slurm node (its .partitions, .state, .flags, .reason): the engine's snapshot
SlurmNodes = Callable[[], Mapping[str, Any]]
PlaceOf = Callable[[str], str | None]  # node -> its leaf switch / NVLink domain (None: unknown)


def reason_owner(reason: str, babysitter_drained: bool, prefix: str) -> str:
    """Whose Slurm reason holds the node: babysitter's automation, an admin (a manual drain
    through babysitter too), the HealthCheckProgram, or nobody."""
    who = ownership.reason_owner(reason, prefix)
    if who is ReasonOwner.NONE:
        return "babysitter" if babysitter_drained else "none"
    if who is ReasonOwner.HEALTHCHECK:
        return "healthcheck"
    return "babysitter" if who is ReasonOwner.AUTOMATIC else "admin"


def _cut(text: str, limit: int = PROBLEM_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class FleetView:
    """Builds the snapshot (refresh(), from the loop thread) and publishes it; `current` is
    what requests read."""

    def __init__(
        self,
        store: Store,
        runtime_state: dict[str, Any],
        slurm_nodes: SlurmNodes,
        switch_of: PlaceOf,
        domain_of: PlaceOf = lambda _: None,
        held: Callable[[], Collection[str]] = frozenset,
        layout_token: Callable[[], object] | None = None,
        min_gap_s: float = 0.0,
    ) -> None:
        """`held`: the nodes the Slurm snapshot shows drained or down; `layout_token`: a value
        that changes whenever a node's partitions, switch or domain may have (default: the
        identity of slurm_nodes()'s mapping); the places and group sizes are worked out again
        only then, or when the set of nodes changed."""
        self.store = store
        self.state = runtime_state
        self.slurm_nodes = slurm_nodes
        self.switch_of = switch_of
        self.domain_of = domain_of
        self.held = held
        self.layout_token = layout_token or (lambda: id(self.slurm_nodes()))
        self.min_gap_s = min_gap_s
        # a snapshot older than this is shown as possibly out of date (the loop is stuck)
        self.stale_after_s = 60.0
        self._current = empty_snapshot()
        self._lock = threading.Lock()  # one build at a time (the loop's; a test's)
        self._layout_key: object = None
        self._names: tuple[str, ...] = ()
        self._names_at = -math.inf
        self._layout = Layout({}, {}, {}, {})

    @property
    def current(self) -> FleetSnapshot:
        return self._current

    def due(self) -> bool:
        return time.monotonic() - self._current.built_at >= self.min_gap_s

    def refresh(self) -> FleetSnapshot:
        """Build a snapshot and publish it. Never raises: a failed read publishes every node
        as unknown, with the error."""
        with self._lock:
            began = time.perf_counter()
            prev = self._current
            try:
                snap = self._build(prev)
            except Exception as exc:
                log.warning("fleet view: the store could not be read: %s", exc)
                snap = _unknown(prev, f"{type(exc).__name__}: {_cut(str(exc), 200)}")
            snap = replace(snap, build_s=time.perf_counter() - began, built_at=time.monotonic())
            if snap.content() == prev.content() and prev.version:
                snap = replace(snap, version=prev.version, changed_at=prev.changed_at)
            else:
                snap = replace(snap, version=prev.version + 1, changed_at=now())
            self._current = snap  # the one publication: a reference swap
            return snap

    def _build(self, prev: FleetSnapshot) -> FleetSnapshot:
        store = self.store
        at = now()
        timeout = float(self.state.get("heartbeat_timeout_s", 120))
        slurm = self.slurm_nodes()
        held = set(self.held())
        # the names are read again when their number changed, and at least every NAMES_S
        fresh = time.monotonic() - self._names_at < NAMES_S
        known = self._names if fresh else None
        names, rows = _read_nodes(store, at - timedelta(seconds=timeout), held, known)
        if names is not known:
            self._names, self._names_at = names, time.monotonic()
        quiet = maintenance.nodes_in_maintenance(store)
        layout = self._placed(names, slurm)
        places = layout.places
        needs = [
            row
            for r in rows
            if (row := self._row(r, slurm.get(r["name"]), held, quiet, places)) is not None
        ]
        rank = {v: i for i, v in enumerate(VERDICTS)}
        needs.sort(key=lambda n: (rank.get(n.verdict, 0), n.name))
        flagged = {n.name for n in needs}
        counts, sick_part, sick_switch, sick_domain = _sick(needs)
        counts["healthy"] += len(names) - len(needs)
        firing = _firing(store)
        jobs = store.jobs()
        return replace(
            prev,
            error=None,
            total=len(names),
            counts=counts,
            by_partition=_by_group(layout.partitions, sick_part),
            by_switch=_by_group(layout.switches, sick_switch),
            by_domain=_by_group(layout.domains, sick_domain),
            needs_human=tuple(needs),
            healthy=tuple(n for n in names if n not in flagged),
            places=places,
            guard=guard_view(store),
            alerts=tuple(firing[:MAX_ALERTS]),
            alerts_total=len(firing),
            windows=tuple(maintenance.windows(store)),
            jobs=tuple(jobs[:MAX_JOBS]),
            jobs_total=len(jobs),
            recent=tuple(audit.entries(store, limit=15)),
        )

    def _row(
        self,
        r: dict[str, Any],
        sn: Any,
        held: set[str],
        quiet: Mapping[str, Any],
        places: Mapping[str, Place],
    ) -> NodeRow | None:
        """The node's row when it needs a human (not healthy, or drained), else None."""
        v = node_view(r, self.state)
        prefix = str(self.state.get("reason_prefix") or "babysitter:")
        reason = (getattr(sn, "reason", "") if sn is not None else "") or (
            r.get("slurm_reason") or r.get("drain_reason") or ""
        )
        state = str(r.get("slurm_state") or "")
        drained = (
            bool(r.get("babysitter_drained"))
            or r["name"] in held
            or any(s in state for s in SLURM_HELD)
        )
        if v["verdict"] == "healthy" and not drained:
            return None
        findings = v["open_findings"]
        return NodeRow(
            name=r["name"],
            verdict=v["verdict"],
            drained=drained,
            maintenance=r["name"] in quiet,
            problem=_cut(str(findings[0]["message"])) if findings else "",
            problems=len(findings),
            owner=reason_owner(reason, bool(r.get("babysitter_drained")), prefix),
            reason=_cut(reason),
            slurm_state=state,
            last_report_at=r.get("last_report_at"),
            place=places.get(r["name"]) or Place((NO_PARTITION,), None, None),
        )

    def _placed(self, names: tuple[str, ...], slurm: Mapping[str, Any]) -> Layout:
        """Every node's place and each group's size: worked out again only when the nodes or
        the layout changed (one pass over every node)."""
        key = (len(names), hash(names), self.layout_token())
        if key == self._layout_key:
            return self._layout
        places: dict[str, Place] = {}
        interned: dict[tuple[Any, ...], Place] = {}
        part_total: Counter[str] = Counter()
        switch_total: Counter[str] = Counter()
        domain_total: Counter[str] = Counter()
        for name in names:
            sn = slurm.get(name)
            parts = tuple(getattr(sn, "partitions", ()) or ()) or (NO_PARTITION,)
            switch, domain = self.switch_of(name), self.domain_of(name)
            p = interned.get((parts, switch, domain))
            if p is None:
                p = interned[(parts, switch, domain)] = Place(parts, switch, domain)
            places[name] = p
        for p, k in Counter(places.values()).items():
            for part in p.partitions:
                part_total[part] += k
            if p.switch:
                switch_total[p.switch] += k
            if p.domain:
                domain_total[p.domain] += k
        self._layout = Layout(places, part_total, switch_total, domain_total)
        self._layout_key = key
        return self._layout


@dataclass(frozen=True)
class Layout:
    places: Mapping[str, Place]
    partitions: Mapping[str, int]
    switches: Mapping[str, int]
    domains: Mapping[str, int]


def _sick(
    needs: list[NodeRow],
) -> tuple[
    dict[str, int], dict[str, Counter[str]], dict[str, Counter[str]], dict[str, Counter[str]]
]:
    """Verdict counts of the nodes that need a human: in all, per partition, switch, domain."""
    counts = dict.fromkeys(VERDICTS, 0)
    sick_part: dict[str, Counter[str]] = {}
    sick_switch: dict[str, Counter[str]] = {}
    sick_domain: dict[str, Counter[str]] = {}
    for n in needs:
        counts[n.verdict] = counts.get(n.verdict, 0) + 1
        for part in n.place.partitions:
            sick_part.setdefault(part, Counter())[n.verdict] += 1
        if n.place.switch:
            sick_switch.setdefault(n.place.switch, Counter())[n.verdict] += 1
        if n.place.domain:
            sick_domain.setdefault(n.place.domain, Counter())[n.verdict] += 1
    return counts, sick_part, sick_switch, sick_domain


def _by_group(
    total: Mapping[str, int], sick: Mapping[str, Counter[str]]
) -> dict[str, dict[str, int]]:
    """group -> verdict -> nodes; a drained-but-healthy node counts as healthy."""
    out: dict[str, dict[str, int]] = {}
    for group in sorted(total):
        c = dict.fromkeys(VERDICTS, 0)
        bad: Mapping[str, int] = sick.get(group) or {}
        for v, k in bad.items():
            c[v] = c.get(v, 0) + k
        c["healthy"] = total[group] - sum(k for v, k in c.items() if v != "healthy")
        out[group] = c
    return out


def _unknown(prev: FleetSnapshot, error: str) -> FleetSnapshot:
    """The store could not be read: every node known so far is unknown, never healthy."""
    names = sorted({*prev.healthy, *(n.name for n in prev.needs_human)})
    rows = tuple(plain_row(prev, name, "unknown", "the store could not be read") for name in names)

    def unknown(groups: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
        return {
            g: {**dict.fromkeys(VERDICTS, 0), "unknown": sum(c.values())} for g, c in groups.items()
        }

    return replace(
        prev,
        error=error,
        counts={**dict.fromkeys(VERDICTS, 0), "unknown": len(names)},
        total=len(names),
        by_partition=unknown(prev.by_partition),
        by_switch=unknown(prev.by_switch),
        by_domain=unknown(prev.by_domain),
        needs_human=rows,
        healthy=(),
        guard={**prev.guard, "state": "unknown"},
    )


def _firing(store: Store) -> list[dict[str, Any]]:
    """Firing alerts, the most severe first."""
    firing = sorted(store.firing_alerts(), key=lambda a: a["key"])
    return sorted(firing, key=lambda a: a["severity"], reverse=True)


def _read_nodes(
    store: Store, stale_before: datetime, held: set[str], known: tuple[str, ...] | None
) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    """Every node's name (`known` when given and as many as the table holds), and the full
    rows of those that may need a human (see the module doc); `held`: nodes the Slurm snapshot
    shows drained or down."""
    n = m.nodes
    may_need = or_(
        n.c.worst_severity != "ok",
        n.c.verdict != "healthy",
        n.c.babysitter_drained == true(),
        n.c.last_report_at.is_(None),
        n.c.last_report_at < stale_before,
        *(n.c.slurm_state.contains(s) for s in SLURM_HELD),
    )
    cols = (
        n.c.name,
        n.c.open_findings,
        n.c.last_report_at,
        n.c.verdict,
        n.c.worst_severity,
        n.c.babysitter_drained,
        n.c.drain_reason,
        n.c.slurm_state,
        n.c.slurm_reason,
    )
    with store.engine.connect() as c:
        # every name, straight from the driver: 10,000 result rows through SQLAlchemy's row
        # objects cost more than the rest of the build
        cur = c.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.execute("SELECT count(*) FROM nodes")
            counted = cur.fetchone()
            if known is not None and counted is not None and counted[0] == len(known):
                names = known
            else:
                cur.execute("SELECT name FROM nodes ORDER BY name")
                names = tuple(r[0] for r in cur.fetchall())
        finally:
            cur.close()
        rows = [r._asdict() for r in c.execute(select(*cols).where(may_need))]
        seen = {r["name"] for r in rows}
        extra = sorted(held - seen)
        for k in range(0, len(extra), 500):
            chunk = extra[k : k + 500]
            rows += [r._asdict() for r in c.execute(select(*cols).where(n.c.name.in_(chunk)))]
    for r in rows:
        r["last_report_at"] = aware(r["last_report_at"])
        r["open_findings"] = [stored_finding(f) for f in r["open_findings"] or []]
    return names, rows
