"""Soak: a simulated fleet at DEFAULT settings under the benign noise a healthy fleet makes
(bench/data/soak_noise.toml), counting what babysitter does anyway: false interruptions (a
healthy babysat job requeued: what costs a training run) and false drains (a node taken out
of the pool: node-time only, the job on it may run on). The ETTR model (bench/ettr.py) charges
the first as job interruptions and the second as node-hours, measured instead of assumed.
Every node runs one babysat job all along (a busy fleet: the worst case for interruptions);
a requeued job is replaced once its node is back in service.

What is real and what is simulated:
- real: one `Agent` per node (its checks from `babysitter.checks.all`, its report assembly,
  its event findings kept until reboot, its "report at once when a signal gets worse"), the
  check code reading simulated hardware, the controller's ingest (`ReportWriter`) into a real
  SQLite store, and the remediation engine's tick (facts, policy, guard, executor);
- simulated: the GPUs (the fake libnvidia-ml, one state file per node), the InfiniBand sysfs
  tree, the kernel log and job logs (files), slurmd's presence (the host check's process
  lookup answers from the node's simulated slurmd), Slurm itself (the in-memory stand-in of
  bench/slurm_standin.py), and the network (a report goes straight to the store, or waits in
  the agent's spool while the controller is down). NVML XID events go through the event
  source's own translation (`NvmlEvents.finding_for`), not its waiting thread.

How time is compressed: a virtual clock. The checks' schedulers (`Check.begin`), the IB
check's clock, the store's and ingest's "now" and the policy tick all read it; nothing sleeps.
The clock jumps from one scheduled step to the next: every agent's full report each
`agent.interval_s` (30 s) followed by a controller tick, and the checks' reads around each
injected change (the grid point before it, the fast tier's next second, every slow-tier grid
point while it lasts and the first after it ends, and the IB sticky window's expiry). Reads
between those would see the same simulated hardware as the previous read and are skipped.
A controller tick runs after every report round and after every report an agent sends at once
(the controller's wake-on-news), so the 1 s loop's idle ticks are skipped too.

A pending action's next attempt (a drain's follow-up, a requeue held for a link fault's grace
and polled every few seconds) gets a tick at its time, as the 1 s loop would run it.

The controller's own clocks read the virtual one as well: its rate limits (time.monotonic: the
Slurm node list every node_refresh_s, the job scan every job_scan_s, ...) and the times it
stamps (datetime.now). On the wall clock they ran every few thousand simulated seconds and made
a run's decisions depend on its speed and on the minute it started. So do the agents' stamps (a
finding's observed_at, a check run's start): on the wall clock, the controller's 24 h XID window
counted findings by how fast the run had gone once it passed 24 simulated hours.

Reports that cannot change anything are not ingested (Soak._round): a node's full report whose
open findings are those its controller row already holds from its previous full report (none
critical; the node not drained, pending an action or under an open remediation) only moves
the row's liveness, sending time and clean streak; it is folded into the row in one bulk
statement instead (no reports/findings history rows for it: no decision reads them for such a
node). A job scan that would scan the same job listing again is skipped likewise. Both are
shown equivalent by tests/test_soak.py: a soak run both ways on one seed (--no-fold) makes the
same decisions (virtual time, node, kind, rule, reason), drains, drain lengths, interruptions
and NHC results.

The node-days run as independent fleets (shards, bench/soak_shards.py) of --shard-nodes nodes,
each with its own seed derived from the run's, its own controller and Slurm, for --days
simulated days, two at a time on two cores, until --budget-s wall seconds have passed (setup
included); the counts are summed. Per-fleet rates (controller failover) apply per shard. A
larger fleet ticks after nearly every report round, a smaller one spends more per node-day on
its rounds: 32 to 128 nodes per shard measured about alike on the 2-core machine, 256 and 512
slower (one core, 128 node-days each: 64 nodes 4.4 node-days per wall second, 256 nodes 3.7,
512 nodes 3.5); 64 (the default) also gives the policy's per-partition drain guard a
fleet-sized partition. A fleet gets somewhat slower as it ages: application XIDs stay open
findings until a reboot (none is simulated), so more and more nodes carry a warning every tick
reads and decides on (a 64-node fleet: 2 days in 29 s, 7 days in 115-127 s on one core). The
default 7 simulated days per shard
(a week-old fleet at most) weighs node-days against fleet age: --days 30 covers month-old
fleets, in fewer node-days.

Every drain is a false drain and every requeue a false interruption here (nothing injected is
a fault); the report names the rule, the reason and the benign events the node had in the 15
minutes before. Upper bound on each rate: the rule of three (3 / node-days) with none, else
the one-sided 95 % Poisson bound.

Alert volume: the controller's alert router sends to counting sinks (bench/soak_alerts.py: a
pager, on-call's Slack, a job channel and a webhook at their default severities), so the report
gives the pages, on-call warnings and job alerts per 1,000 node-days as the real router emitted
them. At the end: the nodes whose agent's last report still had a finding above INFO, and those
findings by check and code.

NHC runs through the same noise on the same nodes: bench/nhc_model.py's model of NHC 1.4.3 (its
checks as bench/nhc.py configures them plus check_hw_ib per port, shown equal to real NHC by
tests/test_bench_nhc_model.py) every 60 s and every 300 s, a random phase per node, draining on a
failed run and resuming on the next clean one. Only its runs while a port is down and the first
after are evaluated: the others read the same all-up tree and pass.

Run: python -m bench.soak [--nodes N] [--shard-nodes n] [--days D] [--budget-s S] [--seed S]
(writes bench/results/soak.json and soak.md; each shard stops at D simulated days, the run at
S wall seconds; by default more shards than 2700 s can run: it reports what it reached)"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import tomllib
import types
import uuid
from collections import Counter
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

from sqlalchemy import Integer, bindparam, update

from babysitter.agent.daemon import Agent
from babysitter.checks.infiniband.check import STICKY_S, InfinibandCheck
from babysitter.checks.infiniband.settings import NCCL_IB_RETRY_BUDGET_S as IB_HOLD_S
from babysitter.checks.nccl.check import NcclLogCheck
from babysitter.checks.nccl.local_jobs import GRACE_S as NCCL_GRACE_S
from babysitter.checks.xid.check import EVENT_XID, KmsgXidCheck, NvmlEvents
from babysitter.config import Config, parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.api.node_state import MAX_OPEN_FINDINGS
from babysitter.controller.db import models as m
from babysitter.controller.db.actions import Action as Recorded
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.node.verdict import drain_worthy
from babysitter.controller.loop.jobs.job_policy import babysit_spec
from babysitter.controller.loop.read.ledger import Ledger
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.devcluster import simib
from babysitter.devcluster.fakenvml import FakeGpus, build, preload
from babysitter.finding import Finding, Severity, no_verdict
from babysitter.report import Report
from babysitter.secretfile import write_private
from babysitter.slurm.client import SlurmJob
from babysitter.wire import WIRE_VERSION
from bench.common import BENCH_DIR, RESULTS_DIR, figure, write_result
from bench.nhc_model import NhcArm, ib_verdict
from bench.poisson import poisson_interval, poisson_upper, quantile
from bench.slurm_standin import InMemorySlurm
from bench.soak_alerts import AlertTally, firing_at_end
from bench.soak_alerts import render as render_alerts
from bench.soak_alerts import summary as alert_summary
from bench.soak_shards import (
    MIN_SHARD_S,
    Outcome,
    ShardSpec,
    WallSplit,
    left_s,
    run_shards,
    shard_specs,
)

NOISE = BENCH_DIR / "data" / "soak_noise.toml"
# the default layout (measured on a 2-core machine, see the module doc): fleets of
# DEFAULT_SHARD_NODES for DEFAULT_DAYS each, more of them than the default budget can run
DEFAULT_SHARD_NODES = 64
DEFAULT_DAYS = 7.0
DEFAULT_NODES = 80 * DEFAULT_SHARD_NODES  # 35,840 node-days: more than 2700 s can run
GPUS = 8
IB_PORTS = 8
NHC_INTERVALS_S = (60.0, 300.0)
LOOKBACK_S = 900.0  # events shown beside a drain: those of the 15 minutes before it
LOOP_S = 1.0  # the controller's loop interval (controller.loop_interval_s at defaults)
SW_POWER_CAP = 0x4  # clock event reason bits (nvml.h)
SW_THERMAL = 0x20
# steps at one instant run in this order: reads before the change they bracket, then changes,
# then the report round and the tick
READ, CHANGE, ROUND = 0, 1, 2
# kind of change -> (the checks that read that hardware, their slow-tier intervals in seconds:
# babysitter/checks/tiers.py and each check's interval_s at defaults)
READERS: dict[str, tuple[frozenset[str], tuple[float, ...]]] = {
    "ecc_sbe": (frozenset({"gpu.memory"}), (60.0, 300.0)),
    "app_xid": (frozenset({"xid.kmsg"}), (1.0,)),  # the fast tier
    "positive_control_xid79": (frozenset({"xid.kmsg"}), (1.0,)),
    "thermal": (frozenset({"gpu.thermal"}), (30.0,)),
    "power": (frozenset({"gpu.thermal"}), (30.0,)),
    "ib_symbol": (frozenset({"ib.ports"}), (30.0,)),
    "ib_flap": (frozenset({"ib.ports"}), (30.0,)),
    "nccl_user_timeout": (frozenset({"nccl.logs"}), (30.0,)),
    "slurmd_restart": (frozenset({"host.resources"}), (60.0,)),
}
QUIET = frozenset({Severity.OK, Severity.INFO})  # below warning: not a problem the policy sees
HOST_CHECK = "babysitter.checks.host.check._process_running"  # slurmd's presence, simulated
# the alert sender's flush waits for its own thread in wall time: its clock stays the real one
WALL_CLOCK_MODULES = frozenset({"babysitter.controller.loop.record.alerts.sender"})
# what a folded report does to its node's row (Soak._flush_folded; node_state's fold_report for a
# full report with the same findings as the last, none above INFO): liveness, sending time, the
# report's id, and the clean streak one longer per report (0 when the report is not clean)
FOLD_UPDATE = (
    update(m.nodes)
    .where(m.nodes.c.name == bindparam("b_name"))
    .values(
        last_report_at=bindparam("at"),
        last_sent_at=bindparam("at"),
        last_report_id=bindparam("rid"),
        consecutive_clean=(m.nodes.c.consecutive_clean + bindparam("k", type_=Integer))
        * bindparam("clean", type_=Integer),
    )
)


class VirtualTime(types.SimpleNamespace):
    """The `time` module as the controller's loop modules see it in the soak: monotonic() is
    the virtual clock; everything else is the real module's."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(monotonic=clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class AgentTime(types.SimpleNamespace):
    """The `time` module as the agent daemon sees it in the soak: time() (when a check's run
    started) is the virtual clock; everything else is the real module's."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(time=clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _virtual_clocks(clock: Clock) -> list[tuple[str, Any]]:
    """(patch target, replacement) for every loaded controller module's `time` (monotonic)
    and `datetime` (now) module attributes: the virtual clock's."""

    class VirtualDatetime(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return datetime.fromtimestamp(clock.t, tz)

    vt = VirtualTime(clock)
    out: list[tuple[str, Any]] = []
    for name, mod in sorted(sys.modules.items()):
        if not name.startswith("babysitter.controller.") or name in WALL_CLOCK_MODULES:
            continue
        if getattr(mod, "time", None) is time:
            out.append((f"{name}.time", vt))
        if getattr(mod, "datetime", None) is datetime:
            out.append((f"{name}.datetime", VirtualDatetime))
    return out


def _agent_clocks(clock: Clock) -> list[tuple[str, Any]]:
    """(patch target, replacement) putting the agents' stamps on the virtual clock: a finding's
    observed_at (`Finding`'s default, babysitter.finding.utcnow) and the start of a check's run
    it is compared with (the agent's time.time()). On the wall clock, every finding's
    observed_at was the minute of the real run: the controller's 24 h XID window (virtual now
    minus 24 h against observed_at) then let findings out by how fast the run had gone, so two
    runs of one seed decided differently once a run passed 24 simulated hours."""
    return [
        ("babysitter.finding.utcnow", clock.now),
        ("babysitter.agent.daemon.time", AgentTime(clock)),
    ]


def _findings(agent: Agent) -> list[Finding]:
    """What the agent's full report carries: its checks' latest and the event findings kept
    until reboot."""
    with agent._lock:
        findings = [f for fs in agent.latest.values() for f in fs]
    findings += agent.sticky.values()
    return findings


def _clean(findings: list[Finding]) -> bool:
    """A report counts towards a resume (node_state's fold_report): nothing drain-worthy and no
    check without a verdict."""
    memo = _UNCLEAN
    for f in findings:
        # a Finding is immutable and an ok one is the same object run after run
        # (Check.steady_ok): asked once per finding, not every round (the memo holds the
        # finding, so no other object can take its id)
        hit = memo.get(id(f))
        if hit is None or hit[0] is not f:
            if len(memo) >= 65536:  # bounded: findings long replaced
                memo.clear()
            hit = memo[id(f)] = (f, drain_worthy(f) or no_verdict(f))
        if hit[1]:
            return False
    return True


_UNCLEAN: dict[int, tuple[Finding, bool]] = {}


class Clock:
    """The virtual clock: seconds since the epoch, moved only by the simulation."""

    def __init__(self, t0: float) -> None:
        self.t = t0

    def __call__(self) -> float:
        return self.t

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


class Network:
    """Stands in for the agent's shipper: a report reaches the controller at once, or waits
    in the agent's spool while the controller is down (replayed in order when it is back)."""

    def __init__(self, sim: Soak, node: str) -> None:
        self.sim, self.node = sim, node
        # the wire version the controller answered with (the shipper learns it from a reply's
        # header): the soak's controller is this release's
        self.controller_wire = WIRE_VERSION

    def submit(self, report: dict[str, Any]) -> None:
        report["sent_at"] = self.sim.clock.now().isoformat()  # the agent's clock is virtual too
        self.sim.deliver(Report.model_validate(report))


@dataclass
class Node:
    name: str
    dir: Path
    gpus: FakeGpus
    cfg: Config
    agent: Agent | None = None
    slurmd_up: bool = True
    # the repeated-report shortcut (Soak._round). `fresh`: its checks ran, it sent an event or
    # its agent started since its findings were last gathered. Of those findings: `problems`,
    # the ones above INFO as the controller stores them (its open findings after a full
    # report), `clean` (they count towards a resume), `critical` (one is critical).
    # `row_problems`: the open findings the controller's row of it holds after its last report
    # in, a full one (None after an event or an agent's first report)
    fresh: bool = True
    problems: list[dict[str, Any]] = field(default_factory=list)
    clean: bool = False
    critical: bool = True
    row_problems: list[dict[str, Any]] | None = None
    history: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, detail)
    # the user jobs running on it, as its slurmd would list them (the NCCL check's local_jobs)
    user_jobs: set[str] = field(default_factory=set)

    @property
    def sysfs(self) -> Path:
        return self.dir / "sysfs"


class _KnownJobs:
    """repr and hang watch of the listing's jobs, worked out once per job object: a SlurmJob is
    frozen and the stand-in replaces a job that changes by a new one (its listing repeats the
    same objects from tick to tick). Only the last listing's jobs are kept (held, so no other
    object can take one's id)."""

    def __init__(self) -> None:
        self.jobs: dict[int, list[Any]] = {}  # id -> [job, repr, hang watch (None: not asked)]

    def _entry(self, j: SlurmJob) -> list[Any]:
        e = self.jobs.get(id(j))
        if e is None or e[0] is not j:
            e = self.jobs[id(j)] = [j, repr(j), None]
        return e

    def text(self, j: SlurmJob) -> str:
        return str(self._entry(j)[1])

    def hang_watch(self, j: SlurmJob) -> bool:
        e = self._entry(j)
        if e[2] is None:
            e[2] = bool((babysit_spec(j) or {}).get("hang_timeout"))
        return bool(e[2])

    def keep(self, listing: list[SlurmJob]) -> None:
        self.jobs = {id(j): self._entry(j) for j in listing}


@dataclass
class Drain:
    t: float
    node: str
    rule: str
    reason: str
    recent_events: list[str]


@dataclass
class Interruption:
    t: float
    node: str
    job_id: int
    reason: str  # the node's drain reason when its job was requeued
    recent_events: list[str]


def load_noise(path: Path = NOISE) -> dict[str, dict[str, Any]]:
    with path.open("rb") as f:
        return tomllib.load(f)


class Soak:
    def __init__(
        self,
        nodes: int,
        seed: int,
        work: Path,
        noise: dict[str, dict[str, Any]],
        nhc_every_run: bool = False,
        *,
        t0: float | None = None,
        first: int = 0,
        shortcut: bool = True,
        log_decisions: bool = False,
    ):
        self.nhc_every_run = nhc_every_run  # evaluate every NHC run, not only those that can fail
        self.shortcut = shortcut  # fold quiet nodes' reports (see _round)
        self.horizon_end = math.inf
        self.rng = random.Random(seed)
        self.work = work
        self.noise = noise
        # on the hour: every grid (reports, check tiers, NHC's phases) then sits alike relative to
        # the run's start, so the same seed gives the same run whatever the wall clock
        self.clock = Clock(float(int(time.time()) // 3600 * 3600) if t0 is None else t0)
        self.t0 = self.clock.t
        self.names = [f"gpu{i:04d}" for i in range(first, first + nodes)]
        # NHC as HealthCheckProgram every 60 s and 300 s, a random phase per node (own stream)
        self.nhc = {iv: NhcArm.new(iv, self.names, seed, self.t0) for iv in NHC_INTERVALS_S}
        self.slurm = InMemorySlurm(self.names)
        self.store = Store(f"sqlite:///{work / 'controller.db'}")
        self.store.upgrade()
        self.writer = ReportWriter(self.store)
        # where the wall time goes (the summary's bound on node-days per wall second)
        self.wall = WallSplit()
        self.writer.write = self.wall.timed("ingest", self.writer.write)  # type: ignore[method-assign]
        self._read = self.wall.timed("agent checks", self._read)  # type: ignore[method-assign]
        self._tick = self.wall.timed("controller tick", self._tick)  # type: ignore[method-assign]
        self._flush_folded = self.wall.timed("folded reports", self._flush_folded)  # type: ignore[method-assign]
        self.ctl_cfg = parse_config({})  # the controller at its defaults
        self.engine: RemediationEngine | None = None
        # what the alert router sends, per sink (every controller's: bench/soak_alerts.py)
        self.alerts = AlertTally()
        self.spooled: list[Report] = []
        self.wake = False
        self.current: Node | None = None
        # ticks after a report round are skipped while they would decide nothing new (see _round)
        self.last_problems: dict[str, frozenset[tuple[str, ...]]] = {}
        self.busy_until = 0.0
        self.ticks_skipped = 0
        self.injected: Counter[str] = Counter()
        self.decisions: Counter[str] = Counter()
        self.drains: list[Drain] = []
        self.interruptions: list[Interruption] = []
        self.drained_since: dict[str, float] = {}
        self.drained_s = 0.0  # node-seconds drained (false drains: node-time lost)
        self.drain_lengths: list[float] = []  # seconds, per drain that ended (resumed)
        self.still_drained: list[float] = []  # seconds so far, per drain open at the end
        self.job_of: dict[str, int] = {}  # node -> its babysat job
        self._job_ids = itertools.count(1)
        self.next_tick = math.inf  # an extra tick for a pending action's next attempt
        self.reports = 0
        self.check_runs = 0
        self.ticks = 0
        self.reports_ingested = 0  # through ReportWriter
        self.reports_folded = 0  # quiet nodes' round reports folded into their node row
        self.fold_flushes = 0
        self.job_scans_skipped = 0
        # node -> (virtual time of its newest folded report, how many folded since the last
        # flush, whether they count as clean): written by _flush_folded before the store is read
        self.folded: dict[str, tuple[float, int, bool]] = {}
        # nodes the shortcut leaves alone: drained in Slurm, a pending action or an open
        # remediation (only a tick changes these: worked out after each)
        self.protected: set[str] = set()
        self.any_drained = False
        # every decision (virtual seconds since t0, node, kind, rule, reason), when asked for
        self.decision_log: list[tuple[float, str, str, str, str]] | None = (
            [] if log_decisions else None
        )
        self._seq = itertools.count()
        self.queue: list[tuple[float, int, int, Any]] = []
        self.nodes: dict[str, Node] = {}
        # the agents' first reads too ask the simulated slurmd (they asked this host's process
        # table: a slurmd.not_running warning on every node until its host check ran again,
        # or none, depending on the host the soak ran on)
        with ExitStack() as stack:
            stack.enter_context(mock.patch(HOST_CHECK, self._process_running))
            for target, new in _agent_clocks(self.clock):
                stack.enter_context(mock.patch(target, new))
            for n in self.names:
                self.nodes[n] = self._make_node(n)
        for n in self.names:
            self._place_job(n)

    # ---- the jobs: one babysat job per node
    def _place_job(self, node: str) -> None:
        jid = next(self._job_ids)
        self.slurm.add_job(
            SlurmJob(jid, name="train", states=("RUNNING",), nodes=(node,), comment="babysit")
        )
        self.job_of[node] = jid

    def _recent(self, node: str) -> list[str]:
        return [
            f"{k} ({detail}) {self.clock.t - t:.0f} s before"
            for t, k, detail in self.nodes[node].history
            if self.clock.t - t <= LOOKBACK_S
        ]

    def _jobs_after_tick(self) -> None:
        """A babysat job requeued is a false interruption; a node back in service gets a new
        job (a drained one takes none)."""
        jobs = {j.job_id: j for j in self.slurm.jobs()}
        reasons = {n.name: n.reason for n in self.slurm.nodes()}
        for node, jid in list(self.job_of.items()):
            j = jobs.get(jid)
            if j is not None and j.running and j.restart_count == 0:
                continue
            self.interruptions.append(
                Interruption(self.clock.t, node, jid, reasons.get(node, ""), self._recent(node))
            )
            self.slurm.remove_job(jid)
            del self.job_of[node]
        for node in self.names:
            if node not in self.job_of and not reasons.get(node):
                self._place_job(node)

    def _schedule_pending(self, pending: list[Recorded]) -> None:
        """A tick when the next pending action is due (the 1 s loop would run it then)."""
        due = [a.next_attempt_at for a in pending if a.next_attempt_at]
        if not due:
            return
        t = max(min(due).timestamp(), self.clock.t + LOOP_S)
        if t < self.next_tick:
            self.next_tick = t
            self.at(t, ROUND, ("tick",))

    # ---- the fleet
    def _make_node(self, name: str) -> Node:
        d = self.work / name
        (d / "jobs").mkdir(parents=True)
        _ib_tree(d / "sysfs")
        (d / "kmsg").write_text("")
        (d / "boot_id").write_text(f"{name}-boot-1\n")
        write_private(d / "node.token", "not-used-no-network\n")
        cfg = parse_config(
            {
                # where this node's simulated hardware and files are; everything else default
                "agent": {
                    "node_name": name,
                    "kmsg_path": str(d / "kmsg"),
                    "spool_path": str(d / "spool.db"),
                    "token_file": str(d / "node.token"),
                    "sysfs_root": str(d / "sysfs"),
                    "boot_id_path": str(d / "boot_id"),
                },
                # the site's hardware (8 GPUs, 8 IB ports) and where its job logs are
                "checks": {
                    "gpu": {"expected_count": GPUS},
                    "infiniband": {"expected_ports": IB_PORTS},
                    "host": {"paths": [str(d)]},
                    "nccl": {"job_log_globs": [str(d / "jobs" / "slurm-*.out")]},
                    # the SDC test needs a GPU matmul library on real GPUs: over the fake NVML
                    # it could only say it cannot run (a warning in every report, so no node
                    # would ever count a clean report and resume). Not simulated.
                    "sdc": {"enabled": False},
                },
            }
        )
        node = Node(name, d, FakeGpus(d / "gpus.state", GPUS), cfg)
        self._start_agent(node)
        return node

    def _start_agent(self, node: Node) -> None:
        # no HTTP client: the shipper is replaced by the simulated network below
        with mock.patch("babysitter.agent.daemon.Shipper"):
            agent = Agent(node.cfg)
        agent.shipper = Network(self, node.name)  # type: ignore[assignment]
        for c in agent.checks:
            # the check's own scheduler, on the virtual clock
            c.begin = lambda now=None, _b=c.begin: _b(self.clock())  # type: ignore[method-assign,misc]
            if isinstance(c, InfinibandCheck):
                c.clock = self.clock
            if isinstance(c, NcclLogCheck):
                # the node's slurmd, simulated: the user jobs running there (the real check
                # asks `scontrol listpids`); an ended job's log is read for its grace, on the
                # virtual clock
                c.local_jobs = lambda n=node: frozenset(n.user_jobs)  # type: ignore[misc]
                c.recent.clock = self.clock
            if isinstance(c, KmsgXidCheck):
                # a job-attributable XID ends with its job: the same simulated slurmd
                c.local_jobs = lambda n=node: frozenset(n.user_jobs)  # type: ignore[misc]
                # a follow-on XID's window, on the virtual clock (the soak's lines carry no
                # kernel timestamp): on the wall clock its outcome hung on the machine's load
                c.clock = self.clock
        node.agent = agent
        # as Agent.run starts: every check once, then a full report
        self._read(node)
        agent.shipper.submit(agent.full_report())

    def _read(self, node: Node, checks: frozenset[str] | None = None) -> None:
        """The node's agent runs its checks (those that read what changed; all of them when
        `checks` is None) now; each reads the signals due on its own (virtual) schedule. The
        fake NVML reads this node's state file."""
        if node.agent is None:
            return
        os.environ["FAKE_NVML_STATE"] = str(node.gpus.path)
        self.current = node
        node.fresh = True  # its next round's report goes in for real
        for c in node.agent.checks:
            if checks is None or c.name in checks:
                node.agent._run_one(c)
                self.check_runs += 1
        self.current = None

    # ---- the controller
    def deliver(self, report: Report) -> None:
        """A report sent at once (an event, a signal gone worse, an agent's first)."""
        self.reports += 1
        node = self.nodes.get(report.node)
        if node is not None:
            node.fresh = True
            node.row_problems = None  # an event report merges into the open findings
        if self.engine is None:
            self.spooled.append(report)
            return
        self._flush_folded((report.node,))  # the ingest reads the rows of its reports' nodes
        self.writer.write([report])
        self.reports_ingested += 1
        self.wake = True

    def _deliver_round(self, reports: list[Report]) -> None:
        self.reports += len(reports)
        if self.engine is None:
            self.spooled += reports
            return
        if reports:
            self._flush_folded({r.node for r in reports})
            self.writer.write(reports)
            self.reports_ingested += len(reports)

    def _flush_folded(self, names: Iterable[str] | None = None) -> None:
        """The node rows as the folded reports would have left them (see _round): liveness
        and sending time of the newest, the clean streak counted on by one per report (reset
        when they were not clean), in one statement for every node with folded reports (of
        `names` only: before an ingest, which reads its own reports' nodes; all of them before
        a tick, which reads every row)."""
        if names is None:
            todo, self.folded = self.folded, {}
        else:
            todo = {n: x for n in names if (x := self.folded.pop(n, None)) is not None}
        if not todo:
            return
        rid = str(uuid.uuid4())  # names no stored report, like each folded report's own id
        at: dict[float, datetime] = {}
        rows = [
            {
                "b_name": name,
                "at": at.get(t) or at.setdefault(t, datetime.fromtimestamp(t, UTC)),
                "rid": rid,
                "k": k,
                "clean": int(clean),
            }
            for name, (t, k, clean) in sorted(todo.items())
        ]
        self.fold_flushes += 1
        with self.store.engine.begin() as c:
            c.execute(FOLD_UPDATE, rows)

    def _tick(self) -> None:
        if self.engine is None:
            return
        self._flush_folded()
        self.ticks += 1
        for d in self.engine.tick(self.clock.now()):
            self.decisions[f"{d.kind}:{d.rule}"] += 1
            if self.decision_log is not None:
                self.decision_log.append(
                    (round(self.clock.t - self.t0, 3), d.node or "", d.kind, d.rule, d.reason)
                )
            if d.kind == "drain" and d.node:
                recent = self._recent(d.node)
                self.drains.append(Drain(self.clock.t, d.node, d.rule, d.reason, recent))
                self.drained_since.setdefault(d.node, self.clock.t)
            elif d.kind == "resume" and d.node in self.drained_since:
                length = self.clock.t - self.drained_since.pop(d.node)
                self.drained_s += length
                self.drain_lengths.append(length)
        self.engine.sender.flush()
        self._jobs_after_tick()
        pending = self.store.pending_actions()
        self._schedule_pending(pending)
        self._protect(pending)

    def _protect(self, pending: list[Recorded]) -> None:
        """After a tick (the only step that drains, resumes, records actions or opens
        remediations): the nodes whose reports the shortcut must not fold."""
        drained = {n.name for n in self.slurm.nodes() if n.reason}
        self.any_drained = bool(drained)
        acting = {a.node for a in pending if a.node}
        open_rem = {r.node for r in Ledger(self.store).open_rows()}
        self.protected = drained | acting | open_rem

    def controller_up(self) -> None:
        """A controller (the first, or the standby taking over) starts on the store."""
        self.engine = make_engine(self.ctl_cfg, self.store, slurm=self.slurm)
        self.alerts.install(self.engine.router)
        if self.shortcut:
            self._skip_repeated_job_scans(self.engine)
        self._busy()
        backlog, self.spooled = sorted(self.spooled, key=lambda r: r.sent_at), []
        if backlog:
            self.writer.write(backlog)
            self.reports_ingested += len(backlog)
        self._tick()

    def _skip_repeated_job_scans(self, engine: RemediationEngine) -> None:
        """The controller's job scan (every job_scan_s: each job's row upserted in its own
        transaction, most of a tick's cost with a job per node) is skipped when it would do
        nothing but stamp the rows' updated_at again (which no decision reads): the same job
        listing and DOWN nodes as the scan before, no running job on a DOWN node (a requeue
        to queue), no hang watch (no job asks for one) and no requeue-limit alert to resolve.
        Its rate limit moves on as if it had run. Off with --no-fold, and compared both ways
        by tests/test_soak.py."""
        jobs = engine.jobs
        real = jobs.tick
        last: list[Any] = [None]
        known = _KnownJobs()

        def tick(slurm_nodes: dict[str, Any], now: datetime) -> None:
            if self.clock.t - jobs._last_scan < jobs.cfg.slurm.job_scan_s:
                return  # the real scan returns here too
            listing = self.slurm.jobs()
            down = frozenset(n for n, sn in slurm_nodes.items() if sn.down)
            key = (tuple(known.text(j) for j in listing), down)
            same = key == last[0]
            last[0] = key
            known.keep(listing)
            if (
                same
                and not any(j.running and down & set(j.nodes) for j in listing)
                and not any(known.hang_watch(j) for j in listing)
                and not any("|job_requeue_limit_" in k for k in jobs.router.firing_keys())
            ):
                jobs._last_scan = self.clock.t
                self.job_scans_skipped += 1
                return
            real(slurm_nodes, now)

        jobs.tick = tick  # type: ignore[method-assign]

    def controller_down(self) -> None:
        if self.engine is not None:
            self._flush_folded()  # before the reports spooled meanwhile
            self.engine.close()
        self.engine = None

    # ---- scheduling
    def at(self, t: float, order: int, what: Any) -> None:
        heapq.heappush(self.queue, (t, order, next(self._seq), what))

    def reads_around(self, node: str, kind: str, start: float, end: float | None = None) -> None:
        """Reads, by the checks that see this kind of change, that bracket a change at `start`
        (lasting until `end`): the grid point before it (counter baselines), the fast tier's
        next seconds, each of their slow-tier grid points while it lasts and the first one
        after. Other checks read hardware that did not change."""
        end = start if end is None else end
        checks, intervals = READERS[kind]
        what = ("read", node, checks)
        self.at(math.floor(start / 30) * 30, READ, what)
        for t in (start, end):
            self.at(math.ceil(t + 1e-9), READ, what)
            self.at(math.ceil(t + 1e-9) + 1, READ, what)
        # the IB counters are read as deltas: the read after the one that saw the change is
        # the one that clears its finding (same hardware, different answer), so one more
        last = end + (2 if kind in ("ib_flap", "ib_symbol") else 1) * max(intervals, default=0)
        for iv in intervals:
            g = math.ceil(start / iv) * iv
            while g <= last:
                self.at(g + 0.001, READ, what)  # just after the change on the grid
                g += iv

    def plan(self, days: float) -> None:
        """Every injected event of the run, drawn up front (seeded)."""
        horizon = days * 86400.0
        self.horizon_end = self.t0 + horizon
        if self.nhc_every_run:  # the shortcut's check: every run of every node
            for arm in self.nhc.values():
                for name in self.names:
                    for r in arm.runs_between(name, self.t0, self.horizon_end):
                        self.at(r, READ, ("nhc", name, arm.interval_s))
        per_node = {k: v for k, v in self.noise.items() if "per_node_day" in v}
        for kind, spec in per_node.items():
            rate = float(spec["per_node_day"]) / 86400.0
            for name in self.names:
                t = self.rng.expovariate(rate) if rate > 0 else math.inf
                while t < horizon:
                    self._plan_one(kind, spec, name, self.t0 + t)
                    t += self.rng.expovariate(rate)
        spec = self.noise.get("controller_failover", {"per_fleet_day": 0, "seconds": [0, 0]})
        rate = float(spec["per_fleet_day"]) / 86400.0
        t = self.rng.expovariate(rate) if rate > 0 else math.inf
        while t < horizon:
            d = self.rng.uniform(*spec["seconds"])
            self.at(self.t0 + t, CHANGE, ("controller_failover", None, d))
            t += self.rng.expovariate(rate)
        g = self.t0 + 30.0
        while g <= self.t0 + horizon:
            self.at(g, ROUND, ("round",))
            g += 30.0

    def _plan_one(self, kind: str, spec: dict[str, Any], node: str, t: float) -> None:
        rng = self.rng
        d = rng.uniform(*spec["seconds"]) if "seconds" in spec else 0.0
        gpu = rng.randrange(GPUS)
        port = rng.randrange(IB_PORTS)
        params: dict[str, Any] = {"gpu": gpu, "port": port, "seconds": d}
        if "count" in spec:
            params["count"] = rng.randint(*spec["count"])
        if kind == "app_xid":
            params["xid"] = rng.choice(spec["xids"])
        if kind == "thermal":
            params["below_slowdown"] = rng.randint(1, 3)
        self.at(t, CHANGE, (kind, node, params))
        if d:
            self.at(t + d, CHANGE, (kind + ":end", node, params))
        if kind in ("agent_restart",):
            return  # the new agent reads everything when it starts
        self.reads_around(node, kind, t, t + d if d else None)
        if kind == "nccl_user_timeout" and d:  # the ended job's log read for the last time
            self.reads_around(node, kind, t + d + NCCL_GRACE_S + 1)
        if kind == "ib_flap":  # the sticky window's end
            self.reads_around(node, kind, t + d + STICKY_S)
            if d > IB_HOLD_S:  # down past the hold, counted from the read that saw it go down
                self.at(
                    math.ceil(t + 1e-9) + math.ceil(IB_HOLD_S),
                    READ,
                    ("read", node, READERS[kind][0]),
                )
            # NHC's runs that can see it: those while the port is down and the next one after
            # (the others read the same all-up tree as before and pass, changing nothing)
            for arm in self.nhc.values():
                for r in arm.runs_between(node, t, t + d):
                    self.at(r, READ, ("nhc", node, arm.interval_s))

    # ---- the benign events
    def apply(self, kind: str, node_name: str | None, p: Any) -> None:
        if kind == "controller_failover":
            self.injected[kind] += 1
            self.controller_down()
            self._busy()
            self.at(self.clock.t + p, CHANGE, ("controller_up", None, None))
            return
        if kind == "controller_up":
            self.controller_up()
            return
        assert node_name is not None
        node = self.nodes[node_name]
        end = kind.endswith(":end")
        base = kind.removesuffix(":end")
        if not end:
            self.injected[base] += 1
            node.history.append((self.clock.t, base, _describe(base, p)))
        gpu, port = p["gpu"], p["port"]
        dev = f"mlx5_{port}"
        if base == "ecc_sbe":
            f = node.gpus.fields
            for key in ("sbe_volatile", "sbe_aggregate"):
                cur = int(f.get(f"gpu{gpu}.{key}", "0"))
                node.gpus.set(gpu, **{key: cur + p["count"]})
        elif base == "app_xid":
            pci = f"0000:{0x18 + gpu:02x}:00"
            with (node.dir / "kmsg").open("a") as fh:
                fh.write(f"NVRM: Xid (PCI:{pci}): {p['xid']}, pid=4242, name=python, benign\n")
            if node.agent is not None:
                src = NvmlEvents(node.agent.ctx)
                node.agent.emit_event([src.finding_for(EVENT_XID, p["xid"], None, gpu)])
        elif base == "positive_control_xid79":
            # NOT benign: a real fault (GPU fallen off the bus), only in the tests' noise files,
            # to show the soak counts and explains a drain when there is one
            pci = f"0000:{0x18 + gpu:02x}:00"
            with (node.dir / "kmsg").open("a") as fh:
                fh.write(f"NVRM: Xid (PCI:{pci}): 79, pid=0, GPU has fallen off the bus.\n")
        elif base == "thermal":
            if end:
                node.gpus.set(gpu, temp=None, clocks_event_reasons=None)
            else:
                # within the check's warning margin of the slowdown threshold (87 C), below it
                node.gpus.set(gpu, temp=87 - p["below_slowdown"], clocks_event_reasons=SW_THERMAL)
        elif base == "power":
            if end:
                node.gpus.set(gpu, power_mw=None, clocks_event_reasons=None)
            else:
                node.gpus.set(gpu, power_mw=695000, clocks_event_reasons=SW_POWER_CAP)
        elif base == "ib_symbol":
            simib.bump_counter(node.sysfs, dev, 1, "symbol_error", p["count"])
        elif base == "ib_flap":
            if end:
                simib.set_port(node.sysfs, dev, 1, active=True)
            else:
                simib.set_port(node.sysfs, dev, 1, active=False)
                simib.bump_counter(node.sysfs, dev, 1, "link_downed")
                simib.bump_counter(node.sysfs, dev, 1, "link_error_recovery")
        elif base == "nccl_user_timeout" and end:
            node.user_jobs.discard(p["job"])  # the aborted job's processes exited: it ended
        elif base == "nccl_user_timeout":
            job = 1000 + self.injected[base]
            p["job"] = str(job)
            node.user_jobs.add(p["job"])
            (node.dir / "jobs" / f"slurm-{job}.out").write_text(
                "step 1200 loss 2.31\n"
                "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE) ran for 600000 "
                "milliseconds before timing out.\n"
            )
        elif base == "slurmd_restart":
            node.slurmd_up = end
        elif base == "agent_restart":
            self._busy()
            if end:
                self._start_agent(node)
                # checks that remember what they read (job log and kernel log offsets, IB
                # counter baselines) answer differently on their runs after the first: the
                # real agent runs them on its schedule, so must the soak (a job's old log line
                # found again by the new agent's first read stayed open to the end without)
                for again in ("nccl_user_timeout", "app_xid", "ib_symbol"):
                    self.reads_around(node.name, again, self.clock.t)
            else:
                node.agent = None  # stopped: no reads, no reports

    # ---- the run
    def run(self, days: float, budget_s: float) -> dict[str, Any]:
        self.plan(days)
        wall0 = time.monotonic()
        with ExitStack() as stack:
            for target in (
                "babysitter.controller.db.store.now",
                "babysitter.controller.api.ingest.now",
            ):
                stack.enter_context(mock.patch(target, self.clock.now))
            stack.enter_context(mock.patch(HOST_CHECK, self._process_running))
            # the controller's own clocks on the virtual one too: its rate limits (Slurm's node
            # list, the job scan, ...: time.monotonic) run every node_refresh_s of simulated
            # time as the real loop's would, not of wall time, and the times it stamps with
            # datetime.now() (alerts, actions) are simulated times like its `now`. Either on
            # the wall clock made a run's decisions depend on how fast it ran and on the minute
            # of the hour it started
            for target, new in _virtual_clocks(self.clock) + _agent_clocks(self.clock):
                stack.enter_context(mock.patch(target, new))
            self.controller_up()
            end_t = self.t0
            while self.queue:
                t, _order, _, what = heapq.heappop(self.queue)
                if time.monotonic() - wall0 > budget_s:
                    break
                if t > self.horizon_end:  # an event's end or a read after the last round
                    break
                if what[0] == "nhc":  # NHC's own run: reads the node, moves no clock
                    if t <= self.horizon_end:
                        node = self.nodes[what[1]]
                        verdict = ib_verdict(node.sysfs / "sys" / "class", IB_PORTS)
                        self.nhc[what[2]].run(what[1], t, verdict)
                    continue
                self.clock.t = max(self.clock.t, t)
                end_t = self.clock.t
                if what[0] == "read":
                    self._read(self.nodes[what[1]], what[2])
                elif what[0] == "round":
                    self._round()
                elif what[0] == "tick":
                    if t >= self.next_tick:
                        self.next_tick = math.inf
                    self._tick()
                else:
                    self.apply(*what)
                if self.wake:
                    self.wake = False
                    self._tick()
            self.controller_down()
        for t in self.drained_since.values():  # still drained at the end
            self.drained_s += end_t - t
            self.still_drained.append(end_t - t)
        for arm in self.nhc.values():
            arm.finish(end_t)
        simulated_s = end_t - self.t0
        return {"simulated_s": simulated_s, "wall_s": time.monotonic() - wall0}

    def outcome(self, run: dict[str, Any], index: int = 0, seed: int = 0) -> Outcome:
        """What this fleet counted, to be merged with the other shards'."""
        n = len(self.names)
        running = [x for x in self.nodes.values() if x.agent is not None]
        return Outcome(
            shards=[
                {
                    "index": index,
                    "seed": seed,
                    "first_node": self.names[0] if self.names else "",
                    "nodes": n,
                    "simulated_hours": run["simulated_s"] / 3600.0,
                    "wall_s": round(run["wall_s"], 1),
                }
            ],
            nodes=n if run["simulated_s"] > 0 else 0,
            node_s=n * run["simulated_s"],
            drains=[d.__dict__ for d in self.drains],
            interruptions=[i.__dict__ for i in self.interruptions],
            drained_s=self.drained_s,
            drain_lengths=list(self.drain_lengths),
            still_drained=list(self.still_drained),
            injected=Counter(self.injected),
            decisions=Counter(self.decisions),
            counts=Counter(
                reports=self.reports,
                reports_ingested=self.reports_ingested,
                reports_folded=self.reports_folded,
                fold_flushes=self.fold_flushes,
                job_scans_skipped=self.job_scans_skipped,
                check_runs=self.check_runs,
                ticks=self.ticks,
                ticks_skipped=self.ticks_skipped,
            ),
            wall_parts=Counter(self.wall.seconds),
            open_at_end=Counter(f["check"] for n in running for f in n.problems),
            open_codes_at_end=Counter(
                f"{f['check']}|{f['code']}|{f['severity']}" for n in running for f in n.problems
            ),
            nodes_open_at_end=sum(1 for n in running if n.problems),
            alerts=Counter(self.alerts.counts),
            alert_conditions=Counter(self.alerts.conditions),
            alerts_firing_at_end=firing_at_end(self.store.firing_alerts()),
            nhc=dict(self.nhc),
        )

    def _round(self) -> None:
        """Every running agent's full report, then a tick when it can decide something.

        The repeated-report shortcut (off with --no-fold): a full report whose findings above
        INFO are, as stored, the open findings the node's row already holds from its last
        report (a full one: no event report since), none of them critical, from a node that
        is not drained, pending an action or under an open remediation, moves the node's row
        in one way only: liveness and sending time to the round's, the clean streak one on (0
        when the report is not clean). Such a report is not ingested: it is folded into the
        node's row (_flush_folded, in one statement for every folded node, before anything
        reads the store), as ReportWriter._fold_report would move it (open_findings,
        worst_severity and metrics stay as they are). What differs: no `reports` row and no
        warning or INFO `findings` rows for a folded report, and last_report_id names no
        stored report. The controller reads those only for a node with an open remediation
        (after_rung.py), for critical XID findings (tickstore.xid_history: never folded), in
        the history API and the RMA archive. A node whose checks did not run since its last
        report (no read, event or agent start) has the same findings: they are not even
        gathered again. tests/test_soak.py runs soaks both ways on one seed and compares every
        decision (virtual time, node, kind, rule, reason), drain, interruption and NHC run."""
        reports = []
        changed = False
        fold = self.shortcut and self.engine is not None
        for node in self.nodes.values():
            agent = node.agent
            if agent is None:
                continue
            findings: list[Finding] | None = None
            if node.fresh:  # its checks ran or it sent an event since: its findings may differ
                findings = _findings(agent)
                problems = frozenset(
                    (f.check, f.component, f.code, str(f.severity), str(f.action))
                    for f in findings
                    if f.severity not in QUIET
                )
                changed |= problems != self.last_problems.get(node.name)
                self.last_problems[node.name] = problems
                node.fresh = False
                node.problems = [f.to_json_dict() for f in findings if f.severity not in QUIET]
                node.clean = _clean(findings)
                node.critical = any(f.severity is Severity.CRITICAL for f in findings)
            if (
                fold
                and node.row_problems is not None
                and not node.critical
                and len(node.problems) < MAX_OPEN_FINDINGS  # beyond: folded anew each time
                and (node.problems is node.row_problems or node.problems == node.row_problems)
                and node.name not in self.protected
            ):
                _, k, _ = self.folded.get(node.name, (0.0, 0, True))
                self.folded[node.name] = (self.clock.t, k + 1, node.clean)
                self.reports_folded += 1
                self.reports += 1
                continue
            reports.append(self._full_report(agent, findings))
            node.row_problems = node.problems
        self._deliver_round(reports)
        # A tick whose facts differ from the previous tick's only by fresher heartbeats decides
        # nothing: no node's problems changed, none is drained (counting clean reports towards
        # a resume), no agent or controller (re)started within a heartbeat timeout.
        drained = self.any_drained
        if changed or drained or self.clock.t < self.busy_until:
            self._tick()
        else:
            self.ticks_skipped += 1

    def _full_report(self, agent: Agent, findings: list[Finding] | None = None) -> Report:
        """Agent.full_report's findings (the checks' latest + the event findings kept until
        reboot) as the Report the controller would parse, without the JSON round trip the
        wire needs (most of a round's cost, and not what the soak measures)."""
        return Report.model_construct(
            node=agent.node,
            report_id=uuid.uuid4(),
            sent_at=self.clock.now(),
            findings=_findings(agent) if findings is None else findings,
            metrics={},
            kind="full",
        )

    def _busy(self) -> None:
        """Heartbeats may be missing or stale until a heartbeat timeout from now: tick."""
        hb = self.ctl_cfg.controller.heartbeat_timeout_s
        self.busy_until = max(self.busy_until, self.clock.t + hb + 60.0)

    def _process_running(self, name: str) -> bool:
        """The host check's process lookup, answered by the node being read."""
        if name == "slurmd" and self.current is not None:
            return self.current.slurmd_up
        return True


@dataclass(frozen=True)
class ShardRun:
    """What every shard of a run shares (run_shard's fixed argument)."""

    noise: dict[str, dict[str, Any]]
    work: Path  # each shard's fleet in a directory of its own under it
    nhc_every_run: bool = False
    shortcut: bool = True
    decision_log: Path | None = None  # a directory: shard-<k>.jsonl, every decision


def run_shard(how: ShardRun, spec: ShardSpec) -> Outcome:
    """One shard: a fleet of its own from the run's start until its days or the run's wall
    deadline (its setup counts against the deadline too)."""
    if left_s(spec) < MIN_SHARD_S:
        return Outcome(shards=[{"index": spec.index, "seed": spec.seed, "nodes": 0}])
    work = how.work / f"shard-{spec.index:04d}"
    work.mkdir(parents=True)
    try:
        sim = Soak(
            spec.nodes,
            spec.seed,
            work,
            how.noise,
            nhc_every_run=how.nhc_every_run,
            t0=spec.t0,
            first=spec.first,
            shortcut=how.shortcut,
            log_decisions=how.decision_log is not None,
        )
        run = sim.run(spec.days, max(0.0, left_s(spec)))
        if how.decision_log is not None and sim.decision_log is not None:
            how.decision_log.mkdir(parents=True, exist_ok=True)
            with (how.decision_log / f"shard-{spec.index:04d}.jsonl").open("w") as fh:
                for row in sim.decision_log:
                    fh.write(json.dumps(row) + "\n")
        return sim.outcome(run, spec.index, spec.seed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _ib_tree(root: Path) -> None:
    """simib.make_tree's layout (8 ports ACTIVE at 400 Gb/s, counters 0), written without its
    per-file atomic rename: nothing reads the tree while it is built, and the fleet's setup
    time was mostly those renames."""
    for i in range(IB_PORTS):
        d = simib.port_dir(root, f"mlx5_{i}", 1)
        (d / "counters").mkdir(parents=True)
        (d / "state").write_text("4: ACTIVE\n")
        (d / "phys_state").write_text("5: LinkUp\n")
        (d / "rate").write_text(simib.RATE_TEXT[400] + "\n")
        for c in simib.COUNTERS:
            (d / "counters" / c).write_text("0\n")
    mad = root / "sys" / "class" / "infiniband_mad"  # what NHC's check_hw_ib reads first
    mad.mkdir(parents=True)
    (mad / "abi_version").write_text("5\n")


def _describe(kind: str, p: dict[str, Any]) -> str:
    if kind == "app_xid":
        return f"XID {p['xid']} on GPU {p['gpu']}"
    if kind in ("ib_flap", "ib_symbol"):
        return f"mlx5_{p['port']}" + (f", down {p['seconds']:.0f} s" if kind == "ib_flap" else "")
    if kind in ("thermal", "power", "ecc_sbe"):
        return f"GPU {p['gpu']}"
    return f"{p['seconds']:.0f} s" if p.get("seconds") else ""


def summarise(o: Outcome, wall_s: float) -> dict[str, Any]:
    """The run's figures from its shards' merged counts; `wall_s`: the whole run's wall time
    (every shard's setup and run, side by side on the workers)."""
    nodes = o.nodes
    node_hours = o.node_s / 3600.0
    node_days = node_hours / 24.0
    fleet_s = sum(x.get("simulated_hours", 0.0) for x in o.shards) * 3600.0
    k = len(o.drains)
    bound = poisson_upper(k, node_days) if node_days > 0 else math.inf
    m = len(o.interruptions)
    i_bound = poisson_upper(m, node_days) if node_days > 0 else math.inf
    causes = Counter(
        d["reason"].split(":", 2)[1].strip() if ":" in d["reason"] else d["reason"]
        for d in o.drains
    )
    return {
        "nodes": nodes,
        # per node on average (shards the deadline stopped early ran less)
        "simulated_hours": node_hours / nodes if nodes else 0.0,
        "node_hours": node_hours,
        "node_days": node_days,
        "wall_s": wall_s,
        "node_days_per_wall_s": node_days / wall_s if wall_s else math.inf,
        # simulated seconds of all the shards' fleets together per wall second
        "compression": fleet_s / wall_s if wall_s else math.inf,
        "shards": o.shards,
        "false_drains": k,
        "false_drains_per_node_day": k / node_days if node_days else math.inf,
        "upper_bound_per_node_day": bound,
        "bound_method": "rule of three (3 / node-days)" if k == 0 else "one-sided 95 % Poisson",
        "false_interruptions": m,
        "false_interruptions_per_node_day": m / node_days if node_days else math.inf,
        "interruptions_upper_bound_per_node_day": i_bound,
        "interruptions_bound_method": (
            "rule of three (3 / node-days)" if m == 0 else "one-sided 95 % Poisson"
        ),
        "interruptions": o.interruptions,
        "drained_node_hours": o.drained_s / 3600.0,
        "drain_hours_mean": o.drained_s / 3600.0 / k if k else 0.0,
        # per drain, minutes; a drain still open at the end counts with its length so far (a
        # lower bound on it), so p99 and max are lower bounds while any is open
        **_drain_length_figures(o),
        "false_drains_ci95_per_node_day": _interval(k, node_days),
        "false_interruptions_ci95_per_node_day": _interval(m, node_days),
        "injected": dict(sorted(o.injected.items())),
        "drains": o.drains,
        "drain_causes": dict(causes),
        "decisions": dict(sorted(o.decisions.items())),
        "reports": o.counts["reports"],
        "reports_ingested": o.counts["reports_ingested"],
        "reports_folded": o.counts["reports_folded"],
        "fold_flushes": o.counts["fold_flushes"],
        "job_scans_skipped": o.counts["job_scans_skipped"],
        "check_runs": o.counts["check_runs"],
        "ticks": o.counts["ticks"],
        "ticks_skipped": o.counts["ticks_skipped"],
        # wall seconds of all shards by part (each counted once; the rest: report rounds'
        # gathering and folding, scheduling, NHC's model), summed over the workers' cores
        "wall_parts_s": {k: round(v, 1) for k, v in sorted(o.wall_parts.items())},
        # the findings above INFO the fleet's nodes reported last, by check: what stays open
        # (events kept until a reboot: application XIDs; counters: SBEs), not drains
        "open_findings_at_end": dict(sorted(o.open_at_end.items())),
        "open_findings_at_end_by_code": dict(sorted(o.open_codes_at_end.items())),
        # nodes whose agent's last report had a finding above INFO: what the status page and
        # `babysitter status` show as a node with a warning (or worse)
        "nodes_open_at_end": o.nodes_open_at_end,
        "nodes_open_at_end_pct": 100.0 * o.nodes_open_at_end / nodes if nodes else 0.0,
        # what each route would have received (bench/soak_alerts.py), NHC's drains beside
        "alerts": alert_summary(
            o.alerts,
            o.alert_conditions,
            o.alerts_firing_at_end,
            node_days,
            {f"{iv:g}": len(arm.drains) for iv, arm in sorted(o.nhc.items())},
        ),
        # NHC's arm on the same nodes and noise (bench/nhc_model.py): false drains and lengths
        "nhc": {f"{iv:g}": arm.summary(node_days) for iv, arm in sorted(o.nhc.items())},
    }


def _shard_text(s: dict[str, Any], settings: dict[str, Any]) -> str:
    ran = [x for x in s["shards"] if x.get("nodes")]
    full = sum(1 for x in ran if x["simulated_hours"] >= settings["days_max"] * 24 - 1e-6)
    sizes = sorted({x["nodes"] for x in ran})
    return (
        f"Shards: {len(ran)} independent fleets of {'/'.join(map(str, sizes)) or 0} nodes "
        f"({full} ran their {settings['days_max']:g} simulated days, the rest until the "
        f"{settings['budget_s']:g} s wall budget ran out), {settings['workers']} at a time, each "
        "with its own seed derived from the run's, its own controller and Slurm; per-fleet "
        "rates (controller failover) apply per shard (bench/soak_shards.py)."
    )


def _fmt_ci(ci: list[float]) -> str:
    return f"[{ci[0]:.3g}, {ci[1]:.3g}]"


def _interval(k: int, node_days: float) -> list[float]:
    if node_days <= 0:
        return [0.0, math.inf]
    return list(poisson_interval(k, node_days))


def _drain_length_figures(o: Outcome) -> dict[str, Any]:
    lengths = [x / 60 for x in o.drain_lengths + o.still_drained]
    return {
        "drain_minutes_p50": quantile(lengths, 0.50),
        "drain_minutes_p99": quantile(lengths, 0.99),
        "drain_minutes_max": max(lengths, default=0.0),
        "drains_resumed": len(o.drain_lengths),
        "drains_open_at_end": len(o.still_drained),
    }


def render_md(s: dict[str, Any], noise: dict[str, dict[str, Any]], settings: dict[str, Any]) -> str:
    lines = [
        "## Soak: false drains and false job interruptions under benign noise at default settings",
        "",
        f"{s['nodes']} simulated nodes (8 GPUs, 8 IB ports each) for {s['simulated_hours']:.1f} "
        f"simulated hours each on average = **{s['node_hours']:,.0f} node-hours** "
        f"({s['node_days']:.1f} node-days) in {s['wall_s']:.0f} s of wall time "
        f"({s['node_days_per_wall_s']:.2f} node-days per wall second; time compressed by a "
        "virtual clock: reads are skipped while the simulated hardware does not change, and a "
        "quiet node's repeated report is folded into its node row instead of ingested; see "
        "bench/soak.py). Real agent, checks, ingest and policy at default settings; fake NVML, "
        "sysfs, kernel and job logs, in-memory Slurm. Seed "
        f"{settings['seed']}.",
        "",
        _shard_text(s, settings),
        "",
        f"**False interruptions (a healthy babysat job requeued): {s['false_interruptions']}** "
        f"({s['false_interruptions_per_node_day']:.3g} per node-day); 95 % upper bound "
        f"**{s['interruptions_upper_bound_per_node_day']:.3g} per node-day** "
        f"({s['interruptions_bound_method']}). Every node ran a babysat job all along.",
        "",
        f"**False drains (node-time only): {s['false_drains']}** "
        f"({s['false_drains_per_node_day']:.3g} per node-day); 95 % upper bound "
        f"**{s['upper_bound_per_node_day']:.3g} per node-day** ({s['bound_method']}); "
        f"{s['drained_node_hours']:.2f} node-hours drained in all "
        f"({s['drain_hours_mean'] * 60:.1f} min per drain on average). Two-sided 95 % "
        f"intervals (Garwood): false drains {_fmt_ci(s['false_drains_ci95_per_node_day'])}, "
        f"false interruptions {_fmt_ci(s['false_interruptions_ci95_per_node_day'])} per "
        f"node-day. Drain length p50 {s['drain_minutes_p50']:.1f} min, p99 "
        f"{s['drain_minutes_p99']:.1f} min, max {s['drain_minutes_max']:.1f} min "
        f"({s['drains_open_at_end']} still drained at the end, counted with their length so "
        "far).",
        "",
        "NHC on the same nodes and noise (bench/nhc_model.py: bench/nhc.py's checks plus "
        "check_hw_ib per port, shown equal to real NHC 1.4.3 by tests/test_bench_nhc_model.py; "
        "a random phase per node; drains on a failed run, resumes on the next clean one):",
        "",
        "| arm | false drains | per node-day [95 % CI] | drain length p50 / p99 / max (min) |",
        "|---|---|---|---|",
        f"| babysitter | {s['false_drains']} | {s['false_drains_per_node_day']:.3g} "
        f"{_fmt_ci(s['false_drains_ci95_per_node_day'])} | {s['drain_minutes_p50']:.1f} / "
        f"{s['drain_minutes_p99']:.1f} / {s['drain_minutes_max']:.1f} |",
        *[
            f"| NHC every {iv} s | {x['false_drains']} | {x['false_drains_per_node_day']:.3g} "
            f"{_fmt_ci(x['false_drains_ci95_per_node_day'])} | {x['drain_minutes_p50']:.1f} / "
            f"{x['drain_minutes_p99']:.1f} / {x['drain_minutes_max']:.1f} |"
            for iv, x in s["nhc"].items()
        ],
        "",
        *render_alerts(s["alerts"]),
        "",
        _open_text(s),
        "",
        "| benign event | injected | rate assumed (per node-day) |",
        "|---|---|---|",
    ]
    for kind, n in s["injected"].items():
        spec = noise.get(kind, {})
        rate = spec.get("per_node_day", spec.get("per_fleet_day"))
        unit = "" if "per_node_day" in spec else " per fleet-day"
        lines.append(f"| {kind}: {spec.get('what', '')} | {n} | {rate}{unit} |")
    if s["interruptions"]:
        lines += ["", "Every interruption, with the benign events its node had before:", ""]
        lines += [
            "| simulated hour | node | job | reason | events before |",
            "|---|---|---|---|---|",
        ]
        for i in s["interruptions"][:50]:
            hour = (i["t"] - settings["t0"]) / 3600
            lines.append(
                f"| {hour:.2f} | {i['node']} | {i['job_id']} | {i['reason'][:160]} | "
                f"{'; '.join(i['recent_events']) or 'none'} |"
            )
    if s["drains"]:
        lines += ["", "Every drain, with the benign events its node had in the 15 min before:", ""]
        lines += [
            "| simulated hour | node | rule | reason | events before |",
            "|---|---|---|---|---|",
        ]
        for d in s["drains"][:50]:
            hour = (d["t"] - settings["t0"]) / 3600
            lines.append(
                f"| {hour:.2f} | {d['node']} | {d['rule']} | {d['reason'][:160]} | "
                f"{'; '.join(d['recent_events']) or 'none'} |"
            )
    lines += [
        "",
        "Controller decisions by kind and rule: "
        + ", ".join(f"{k} {v}" for k, v in s["decisions"].items())
        + f". Reports sent {s['reports']:,}: ingested {s['reports_ingested']:,}, folded "
        f"{s['reports_folded']:,} (a quiet node's repeated full report: its node row moved as "
        f"the ingest would move it, in {s['fold_flushes']:,} bulk updates); check runs "
        f"{s['check_runs']:,}, ticks {s['ticks']:,} ({s['ticks_skipped']:,} skipped after "
        f"rounds that could decide nothing; {s['job_scans_skipped']:,} job scans skipped that "
        "would have scanned the same jobs again).",
        "",
        _wall_text(s),
        "",
    ]
    return "\n".join(lines)


def _open_text(s: dict[str, Any]) -> str:
    """What stays open at the end: nodes with a warning or worse, findings by check and code."""
    by_code = ", ".join(f"{k} {v}" for k, v in s["open_findings_at_end_by_code"].items())
    return (
        f"**Open at the end: {s['nodes_open_at_end']} of {s['nodes']} nodes "
        f"({s['nodes_open_at_end_pct']:.1f} %) with a finding above INFO** in their agent's "
        "last report (what the status page shows as a node with a warning or worse). Open "
        "findings by check: "
        + (", ".join(f"{k} {v}" for k, v in s["open_findings_at_end"].items()) or "none")
        + (f" (check|code|severity: {by_code})" if by_code else "")
        + "."
    )


def _wall_text(s: dict[str, Any]) -> str:
    """Where the wall time went: what bounds the node-days per wall second."""
    parts = dict(s.get("wall_parts_s") or {})
    total = sum(x.get("wall_s", 0.0) for x in s["shards"])  # the shards' runs, all workers
    if not parts or total <= 0:
        return ""
    parts["the rest (report rounds' gathering and folding, schedule, NHC's model)"] = max(
        0.0, total - sum(parts.values())
    )
    shares = ", ".join(
        f"{k} {v / total:.0%}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
    )
    per_tick = 1000.0 * parts.get("controller tick", 0.0) / max(s["ticks"], 1)
    return (
        f"Where the shards' wall time went ({total:,.0f} s of runs over the workers, each "
        f"second counted once): {shares}. A controller tick took {per_tick:.1f} ms on average, "
        f"{s['ticks'] / max(s['node_days'], 1e-9):.1f} ticks per node-day."
    )


def _alert_figures(s: dict[str, Any]) -> list[dict[str, Any]]:
    """Alert volume and what stays open, with issue #51's goals."""
    a = s["alerts"]
    out = []
    for what, key, goal in (
        ("pages (critical, to on-call)", "pages", 1.0),
        ("warnings to on-call", "oncall_warnings", 10.0),
        ("job alerts (job route, never the pager)", "job_alerts", None),
    ):
        x = a[key]
        rate = x["per_1000_node_days"]
        out.append(
            figure(
                f"{what} per 1,000 node-days of benign noise (soak)",
                rate,
                "per 1,000 node-days",
                goal=None if goal is None else f"<= {goal:g}",
                met=None if goal is None or rate is None else rate <= goal,
                n=x["n"],
                ci95_two_sided=x["ci95"],
                node_days=s["node_days"],
            )
        )
    out.append(
        figure(
            "nodes with a finding above INFO open at the soak's end",
            s["nodes_open_at_end_pct"],
            "% of nodes",
            goal="<= 1",
            met=s["nodes_open_at_end_pct"] <= 1.0,
            n=s["nodes_open_at_end"],
            nodes=s["nodes"],
            by_check=s["open_findings_at_end"],
        )
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--nodes", type=int, default=DEFAULT_NODES, help="nodes in all (split into shards)"
    )
    ap.add_argument(
        "--shard-nodes", type=int, default=DEFAULT_SHARD_NODES, help="nodes per shard (a fleet)"
    )
    ap.add_argument(
        "--days", type=float, default=DEFAULT_DAYS, help="simulated days per shard (at most)"
    )
    ap.add_argument(
        "--budget-s", type=float, default=2700.0, help="wall seconds for the whole run (at most)"
    )
    ap.add_argument(
        "--workers", type=int, default=min(2, os.cpu_count() or 1), help="shards at a time"
    )
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--results", type=Path, default=RESULTS_DIR)
    ap.add_argument("--noise", type=Path, default=NOISE, help="benign noise (rates, durations)")
    ap.add_argument(
        "--nhc-every-run",
        action="store_true",
        help="evaluate every NHC run (the check of the shortcut that skips runs that cannot fail)",
    )
    ap.add_argument(
        "--no-fold",
        action="store_true",
        help="ingest every report, quiet nodes' too (the check of the quiet-node shortcut)",
    )
    ap.add_argument(
        "--decision-log",
        type=Path,
        help="write every decision of shard k to DIR/shard-<k>.jsonl (virtual seconds since "
        "the start, node, kind, rule, reason)",
    )
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    preload(build())  # the fake libnvidia-ml, before pynvml's first nvmlInit
    noise = load_noise(args.noise)
    # memory-backed when there is one: the store's and spools' fsyncs are not what is measured
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="bench-soak-", dir=shm if shm.is_dir() else None))
    # on the hour, common to every shard: every grid (reports, check tiers, NHC's phases) sits
    # alike relative to the start, so the same seed gives the same run whatever the wall clock
    t0 = float(int(time.time()) // 3600 * 3600)
    specs = shard_specs(
        args.nodes, args.shard_nodes, args.seed, args.days, t0, t_start + args.budget_s
    )
    how = ShardRun(
        noise,
        work,
        nhc_every_run=args.nhc_every_run,
        shortcut=not args.no_fold,
        decision_log=args.decision_log,
    )
    try:
        out = run_shards(specs, functools.partial(run_shard, how), args.workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s = summarise(out, time.monotonic() - t_start)
    settings = {
        "nodes": args.nodes,
        "shard_nodes": args.shard_nodes,
        "shards": len(specs),
        "workers": args.workers,
        "fold_quiet_reports": not args.no_fold,
        "days_max": args.days,
        "budget_s": args.budget_s,
        "seed": args.seed,
        "agent_and_controller": "defaults (site paths, 8 GPUs and 8 IB ports expected)",
        "noise": str(args.noise),
        "t0": t0,
        "nhc_every_run": args.nhc_every_run,
    }
    md = render_md(s, noise, settings)
    figs = [
        figure("soak: node-hours simulated (compressed time)", s["node_hours"], "node-hours"),
        figure(
            "false drains per node-day at default settings under benign noise (soak)",
            s["false_drains_per_node_day"],
            "per node-day",
            n=s["false_drains"],
            upper_bound=s["upper_bound_per_node_day"],
            ci95_two_sided=s["false_drains_ci95_per_node_day"],
            node_days=s["node_days"],
        ),
        figure(
            "false drains per node-day, 95 % upper bound (soak)",
            s["upper_bound_per_node_day"],
            "per node-day",
            method=s["bound_method"],
            drain_hours_mean=s["drain_hours_mean"],
        ),
        figure(
            "false job interruptions per node-day at default settings under benign noise (soak)",
            s["false_interruptions_per_node_day"],
            "per node-day",
            n=s["false_interruptions"],
            upper_bound=s["interruptions_upper_bound_per_node_day"],
            ci95_two_sided=s["false_interruptions_ci95_per_node_day"],
            node_days=s["node_days"],
        ),
        figure(
            "false drain length p99 (soak)",
            s["drain_minutes_p99"],
            "minutes",
            p50=s["drain_minutes_p50"],
            max=s["drain_minutes_max"],
            open_at_end=s["drains_open_at_end"],
        ),
        figure(
            "false job interruptions per node-day, 95 % upper bound (soak)",
            s["interruptions_upper_bound_per_node_day"],
            "per node-day",
            method=s["interruptions_bound_method"],
        ),
        figure("soak: benign events injected", float(sum(s["injected"].values())), "events"),
        *[
            figure(
                f"NHC every {iv} s: false drains per node-day under the same noise (soak, model)",
                x["false_drains_per_node_day"],
                "per node-day",
                n=x["false_drains"],
                ci95_two_sided=x["false_drains_ci95_per_node_day"],
                node_days=s["node_days"],
                drain_minutes_p50=x["drain_minutes_p50"],
                drain_minutes_p99=x["drain_minutes_p99"],
                drain_minutes_max=x["drain_minutes_max"],
                drain_hours_mean=x["drain_hours_mean"],
            )
            for iv, x in s["nhc"].items()
        ],
        *_alert_figures(s),
    ]
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "soak.md").write_text(md)
    write_result(
        "soak",
        figs,
        s,
        settings=settings,
        results_dir=args.results,
        duration_s=round(time.monotonic() - t_start, 1),
    )
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
