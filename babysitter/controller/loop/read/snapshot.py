"""The controller's view of Slurm's nodes: one listing of every node, shared by every decision
of a tick, re-read at a bounded rate on its own thread, with the controller's own drains and
resumes applied to it at once, and the aggregates worked out once per listing (the guard's
partition sizes and babysitter-drained counts, the nodes Slurm holds, the nodes that changed)
plus the sweep order every node goes through the policy in."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace

from babysitter.config import Config
from babysitter.slurm.client import SlurmClient, SlurmError, SlurmNode
from babysitter.slurm.ownership import BABYSITTER_WRITTEN, reason_owner
from babysitter.slurm.topology import Topology

log = logging.getLogger(__name__)
# every node goes through the policy at least this often, changed or not (a safety net: a
# steady tick passes only the nodes that may need a decision, see controller/db/tickstore.py):
# each tick sweeps its share of the nodes in turn, no tick pays for all of them at once
FULL_PASS_S = 600.0
# a node listing the tick waits for at most (then it decides on the previous one); clusters
# smaller than SNAPSHOT_ASYNC_NODES are listed in well under that and always waited for
SNAPSHOT_WAIT_S = 0.2
SNAPSHOT_ASYNC_NODES = 1000


class SlurmSnapshot:
    def __init__(self, cfg: Config, slurm: SlurmClient) -> None:
        self.cfg = cfg
        self.slurm = slurm
        self.nodes: dict[str, SlurmNode] = {}
        self.ok = False
        # the node snapshot is re-read every slurm.node_refresh_s, or at once after a change
        self.read_at = 0.0
        self.stale = True
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="slurm-snapshot")
        self._snap: Future[list[SlurmNode]] | None = None
        self._snap_started = 0.0
        self._moved: dict[str, tuple[float, SlurmNode]] = {}  # our changes since: see read()
        self._sweep: list[str] = []  # every node in Slurm, in the sweep's order
        self._sweep_at = 0
        # per node snapshot: nodes whose Slurm state changed (the next tick passes them to the
        # policy), nodes Slurm holds drained/down, and the guard's partition aggregates
        self.changed: set[str] = set()
        self.held: set[str] = set()
        self.partitions: dict[str, int] = {}
        self.drained_by_us: dict[str, int] = {}
        # Slurm's switches over the nodes, re-read on its own slow schedule (fabric_loop.py)
        self.topology = Topology()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def read(self, force: bool = False) -> bool:
        """One snapshot of every Slurm node, shared by every decision of the tick. At 10,000
        nodes each read costs slurmctld ~20 ms of CPU (bench/slurm_load.py), so it is re-read
        at a bounded rate; ownership is re-checked by the drain/resume call itself. The
        partition aggregates the guard needs and the nodes whose Slurm state changed are
        worked out here, once per snapshot, not once per tick.

        The listing runs on its own thread. A large cluster's listing takes 0.5 s and more
        (seconds on a busy host): the tick waits at most SNAPSHOT_WAIT_S for it and otherwise
        decides on the previous snapshot plus its own drains/resumes since (`_moved`), and a
        later tick takes the new one up. A small cluster's tick waits for it, as does the
        first tick. Returns True when a snapshot was taken up (or the read failed)."""
        fresh = time.monotonic() - self.read_at < self.cfg.slurm.node_refresh_s
        started = False
        if self._snap is None and not (self.ok and fresh and not self.stale and not force):
            self._snap = self._pool.submit(self.slurm.nodes)
            self._snap_started = time.monotonic()
            started = True
        if self._snap is None:
            return False
        small = 0 < len(self.nodes) < SNAPSHOT_ASYNC_NODES
        # only the tick that starts a listing waits for it; later ticks only look
        wait = (SNAPSHOT_WAIT_S if started else 0.0) if self.nodes and not small else None
        try:
            listing = self._snap.result(timeout=wait)
        except FutureTimeout:
            return False
        except SlurmError as exc:
            self._snap = None
            if self.ok:
                log.warning("Slurm unavailable, decisions will wait: %s", exc)
            self.ok = False
            return True
        finally:
            if self._snap is not None and self._snap.done():
                self._snap = None
        self.ok = True
        self.read_at = time.monotonic()
        self.stale = False
        snapshot = {n.name: n for n in listing}
        # our own changes made after this listing started are not in it yet
        self._moved = {k: v for k, v in self._moved.items() if v[0] >= self._snap_started}
        for name, (_, node) in self._moved.items():
            if name in snapshot:
                snapshot[name] = node
        old, self.nodes = self.nodes, snapshot
        if len(old) != len(snapshot) or old.keys() != snapshot.keys():
            self._sweep = sorted(snapshot)
        # (the cli backend hands back the same object for an unchanged node line)
        self.changed.update(
            name for name, sn in snapshot.items() if (o := old.get(name)) is not sn and o != sn
        )
        self.changed.update(name for name in old if name not in snapshot)
        self._aggregate()
        return True

    def _aggregate(self) -> None:
        """The guard's partition sizes and babysitter-drained counts, and the nodes Slurm
        holds drained/down, from the current snapshot."""
        prefix = self.cfg.slurm.reason_prefix
        partitions: dict[str, int] = {}
        drained_by_us: dict[str, int] = {}
        held: set[str] = set()
        for known in self.nodes.values():
            parts = known.partitions or ("default",)
            for p in parts:
                partitions[p] = partitions.get(p, 0) + 1
            if known.drained_or_draining or known.down:
                held.add(known.name)
                # every drain babysitter wrote counts against its caps (an admin's and the
                # check's through babysitter too): counting more is the safe side
                owner = reason_owner(known.reason, prefix)
                if known.drained_or_draining and owner in BABYSITTER_WRITTEN:
                    for p in parts:
                        drained_by_us[p] = drained_by_us.get(p, 0) + 1
        self.partitions, self.drained_by_us, self.held = partitions, drained_by_us, held

    def moved_here(self, drained: list[tuple[str, str]], resumed: list[str]) -> None:
        """Our own drains/resumes, applied to the snapshot at once: the next tick must not
        decide them again (nor the guard count without them) before the next listing."""
        at = time.monotonic()
        prefix = self.cfg.slurm.reason_prefix
        for name, reason in drained:
            if (sn := self.nodes.get(name)) is not None:
                node = replace(sn, flags=sn.flags | {"DRAIN"}, reason=f"{prefix} {reason}")
                self.nodes[name] = node
                self._moved[name] = (at, node)
        for name in resumed:
            if (sn := self.nodes.get(name)) is not None:
                node = replace(sn, flags=sn.flags - {"DRAIN", "DRAINED", "DRAINING"}, reason="")
                self.nodes[name] = node
                self._moved[name] = (at, node)
        if drained or resumed:
            self.changed.update(n for n, _ in drained)
            self.changed.update(resumed)
            self._aggregate()

    def sweep_share(self) -> set[str]:
        """This tick's share of every node, in turn: all of them within FULL_PASS_S."""
        if not self._sweep:
            return set()
        ticks = max(1.0, FULL_PASS_S / self.cfg.controller.loop_interval_s)
        k = max(1, -(-len(self._sweep) // int(ticks)))
        start = self._sweep_at % len(self._sweep)
        self._sweep_at = start + k
        return set(self._sweep[start : start + k])
