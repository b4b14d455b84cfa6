"""The soak's shards (bench/soak.py): its node-days run as several independent simulated fleets
of moderate size, each with its own seed, on up to one worker process per core.

Why shards: a controller tick's cost grows with the fleet (it reads the nodes that may need a
decision, Slurm's node list, the jobs), and a large fleet ticks after nearly every report round;
a small fleet ticks only around its own events. Many moderate fleets cover more node-days per
wall second than one large one, and two of them run side by side on two cores.

What a shard is: a whole soak of `nodes` nodes (its own controller store, in-memory Slurm,
agents, noise drawn from its own seed and NHC phases), from the run's common start `t0` for up
to `days` simulated days or until the run's wall deadline. Per-fleet rates (controller
failover, noise's `per_fleet_day`) apply per shard: a shard is a fleet. The policy's
per-partition guard sees the shard's fleet (its partition is the shard's nodes).

Seeds: shard k's seed is derived from the run's seed and k (sha256), so every shard draws
different noise and the same run seed gives the same shards; the derived seeds are checked to be
distinct. Node names run on across shards (gpu0000.. in the first, then the next), so a drain
names one node of the whole run."""

from __future__ import annotations

import hashlib
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.nhc_model import NhcArm

MIN_SHARD_S = 5.0  # a shard with less wall time left than this is not started (setup alone)


@dataclass(frozen=True)
class ShardSpec:
    index: int
    seed: int
    first: int  # the number of its first node: its names are gpu{first}.. gpu{first+nodes-1}
    nodes: int
    days: float
    t0: float  # the run's common simulated start (on the hour)
    deadline: float  # time.monotonic() by which the shard stops (the run's wall budget)


def shard_seed(seed: int, index: int) -> int:
    """Shard `index`'s seed: a hash of the run's seed and the index (63 bits)."""
    digest = hashlib.sha256(f"bench.soak/{seed}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def shard_specs(
    total_nodes: int, shard_nodes: int, seed: int, days: float, t0: float, deadline: float
) -> list[ShardSpec]:
    """`total_nodes` split into fleets of `shard_nodes` (the last one may be smaller)."""
    if total_nodes < 1 or shard_nodes < 1:
        raise ValueError("nodes and shard nodes must be at least 1")
    specs: list[ShardSpec] = []
    first = 0
    while first < total_nodes:
        n = min(shard_nodes, total_nodes - first)
        k = len(specs)
        specs.append(ShardSpec(k, shard_seed(seed, k), first, n, days, t0, deadline))
        first += n
    if len({s.seed for s in specs}) != len(specs):  # independent shards: distinct seeds
        raise ValueError(f"two shards of seed {seed} got the same derived seed")
    return specs


class WallSplit:
    """Wall seconds by part of the simulation, each second counted once: a part running inside
    another (an agent's event report ingested during its check run) is its own, not the outer
    one's. What the soak's node-days per wall second are bounded by."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self._stack: list[list[Any]] = []  # [part, since]

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        now = time.perf_counter()
        if self._stack:
            outer = self._stack[-1]
            self.seconds[outer[0]] += now - outer[1]
        self._stack.append([name, now])
        try:
            yield
        finally:
            end = time.perf_counter()
            part, since = self._stack.pop()
            self.seconds[part] += end - since
            if self._stack:
                self._stack[-1][1] = end

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def inner(*a: Any, **kw: Any) -> Any:
            with self.part(name):
                return fn(*a, **kw)

        return inner


@dataclass
class Outcome:
    """What one shard counted, or several merged (sums and concatenations)."""

    shards: list[dict[str, Any]] = field(default_factory=list)  # index, seed, nodes, times
    nodes: int = 0  # nodes of the shards that ran
    node_s: float = 0.0  # node-seconds simulated
    drains: list[dict[str, Any]] = field(default_factory=list)
    interruptions: list[dict[str, Any]] = field(default_factory=list)
    drained_s: float = 0.0
    drain_lengths: list[float] = field(default_factory=list)  # resumed drains, seconds
    still_drained: list[float] = field(default_factory=list)  # open at the end, so far
    injected: Counter[str] = field(default_factory=Counter)
    decisions: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)  # reports, folded, ticks, ...
    open_at_end: Counter[str] = field(default_factory=Counter)  # open findings by check
    open_codes_at_end: Counter[str] = field(default_factory=Counter)  # check|code|severity
    nodes_open_at_end: int = 0  # nodes with a finding above INFO open at the end
    # bench/soak_alerts.py: sink|route|severity|kind, route|severity|condition family (fired),
    # route|severity of the alerts still firing at the end
    alerts: Counter[str] = field(default_factory=Counter)
    alert_conditions: Counter[str] = field(default_factory=Counter)
    alerts_firing_at_end: Counter[str] = field(default_factory=Counter)
    wall_parts: Counter[str] = field(default_factory=Counter)  # WallSplit's seconds
    nhc: dict[float, NhcArm] = field(default_factory=dict)

    def add(self, o: Outcome) -> None:
        self.shards += o.shards
        self.nodes += o.nodes
        self.node_s += o.node_s
        self.drains += o.drains
        self.interruptions += o.interruptions
        self.drained_s += o.drained_s
        self.drain_lengths += o.drain_lengths
        self.still_drained += o.still_drained
        self.injected.update(o.injected)
        self.decisions.update(o.decisions)
        self.counts.update(o.counts)
        self.open_at_end.update(o.open_at_end)
        self.open_codes_at_end.update(o.open_codes_at_end)
        self.nodes_open_at_end += o.nodes_open_at_end
        self.alerts.update(o.alerts)
        self.alert_conditions.update(o.alert_conditions)
        self.alerts_firing_at_end.update(o.alerts_firing_at_end)
        self.wall_parts.update(o.wall_parts)
        for iv, arm in o.nhc.items():
            mine = self.nhc.setdefault(iv, NhcArm(iv, {}))
            mine.drains += arm.drains
            mine.lengths += arm.lengths
            mine.still_drained += arm.still_drained
            mine.runs += arm.runs

    def sort(self) -> None:
        """One order whatever order the shards finished in."""
        self.shards.sort(key=lambda s: s["index"])
        self.drains.sort(key=lambda d: (d["t"], d["node"]))
        self.interruptions.sort(key=lambda d: (d["t"], d["node"]))
        self.drain_lengths.sort()
        self.still_drained.sort()
        for arm in self.nhc.values():
            arm.drains.sort(key=lambda d: (d["t"], d["node"]))
            arm.lengths.sort()
            arm.still_drained.sort()


def run_shards(
    specs: list[ShardSpec], worker: Callable[[ShardSpec], Outcome], workers: int
) -> Outcome:
    """Every shard through `worker` (in this process with one worker; else a fresh forked
    process per shard, `workers` at a time), merged. Shards that find the deadline (almost)
    reached return at once with nothing counted."""
    total = Outcome()
    results: Iterable[Outcome]
    if workers <= 1 or len(specs) <= 1:
        results = map(worker, specs)
        for o in results:
            total.add(o)
    else:
        # fork: the children inherit the fake libnvidia-ml loaded before; one shard per child
        # keeps each shard's process state (patches, the NVML library's) its own
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers, maxtasksperchild=1) as pool:
            for o in pool.imap_unordered(worker, specs):
                total.add(o)
    total.sort()
    return total


def left_s(spec: ShardSpec) -> float:
    return spec.deadline - time.monotonic()
