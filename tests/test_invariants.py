"""The safety invariants (docs/policy.md, "Safety invariants") against sequences nobody wrote by
hand: a hypothesis rule-based state machine drives the REAL remediation engine (policy, fabric
and NVLink-domain steps, healer, validator, executor, admission) over an in-memory Slurm
(tests/fixtures/invariants.py) and a SQLite store, through faults and clears, job-owned log
lines, check crashes, Slurm outages, admin drains and resumes (in Slurm and through babysitter)
mid-episode, maintenance windows and unreadable ones, reboots completing, controller restarts,
NVLink fabric faults on one node (the restart_fabric rung) or on several of one NVLink domain
at once (a domain incident) and their clears, and the agents answering their orders (a fabric
service restart, a GPU reset: done, refused, failed, or no answer), and checks every invariant
after every step:

- no cap is exceeded: babysitter's automatic drains per switch, NVLink domain, partition and
  cluster, and new automatic drains per rolling hour;
- no automatic change of a node someone else holds (an admin's `[manual]` drain included), nor
  an order to its agent (a GPU reset, a Fabric Manager / IMEX restart);
- a node whose only evidence is job-owned is never drained, and never joins a domain incident
  (a job's line naming NVLink on every node of a domain correlates nothing);
- no automatic resume without clean evidence (the node's latest report clean);
- while the maintenance windows cannot be read, no new automatic action (nor order).

The side doors of issue 49 (tests/fixtures/invariants_side_doors.py) are in the model too, as
rules (a job's lines folded by the real ingest, the HealthCheckProgram draining mid-episode, a
window opening while an order is out, agents restarting, old passed validations before an
incident, missing or malformed verdicts, nodes of unknown NVLink domain, reloads changing caps)
and invariants: orders carried out only with their permission, a pass only on a readable
verdict, no return without this drain's validation, an unknown domain held, caps never loosened
without the opt-in; the Slurm stand-in refuses what the real client's ownership check refuses
(`ClientSlurm`). With each fix undone in a scratch copy, the machine itself (not a written
case) reported the invariant named, on the sequence it shrank to:
- 469eeca's fold (ingest `_fold` as before): job_owned_evidence_never_drains, after
  `start(nodes=[])`, `job_flood(lines=9, nodes=['node1'], own=False)`;
- 469eeca's client (`OwnedClient.owns` as before): nothing_automatic_on_someone_elses_node,
  `start(nodes=['node1'], kind='xid79')`, `verdicts(healthcheck=True, kind='no_devices')`;
- 4a6ac76 (no hand-out filter, no expiry, the agent's memory only):
  orders_carried_out_only_with_permission ("a second time"), `start(nodes=['node1'],
  kind='dbe')`, `agent_restart(i=0)`; without agent restarts, "inside a maintenance window":
  `start(nodes=['node1'], kind='fabric')`, `agents_answer('done')`, `window_over_order(i=0)`,
  `agents_answer('done')`;
- 1c32c8d's verdict (exit 0 passed whatever the verdict said): a_pass_needs_a_readable_verdict,
  `start(nodes=['node1', 'node2'], kind='xid79')`, `verdicts(kind='no_devices')`;
- 1c32c8d's episodes (no history restarted at an incident's drain):
  no_return_without_this_drains_validation, `start(nodes=[], validate=True)`,
  `old_validation(leaf='leaf1', incident=True, clean=2)`;
- ebde93b (git revert): caps_never_loosen_without_opt_in, `start(nodes=[])`,
  `reload_caps(key='blast_radius.cluster_count', opt_in=False, to='looser')`;
- 628783f^ (admission before "scope unknown"): unknown_domain_is_held, `start(nodes=[])`,
  `old_agent(kind='disk', node='node1')`; and caps_hold (NVLink domain cap 2 exceeded),
  `start(nodes=['node5', 'node3'], kind='xid79')`, `old_agent(kind='disk', node='node1')`.

`make test` runs over a thousand short sequences (6 steps, 8 for the fabric, 10 for all the
rules), split by focus into tests xdist runs side by side (caps against outages and restarts;
admins taking over; evidence against maintenance windows; NVLink domains and the restart_fabric
rung; all the rules), each on a fixed seed (the same sequences every run); every sequence
starts with some nodes faulty (or none), so short ones begin mid-incident. Each prints its
counts (sequences, steps, engine ticks, and how many sequences reached a cap, an outage, a
takeover, a restart, a domain incident, a fabric restart...: the summary at the end of the
run). `make reliability` (BABYSITTER_RELIABILITY=full) runs 11,000 longer ones. A deliberately
broken cap is caught (test_a_broken_cap_is_caught, test_a_broken_domain_cap_is_caught)."""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Collection, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import babysitter.controller.api.ingest as ingest_mod
import babysitter.controller.db.audit as audit_mod
import babysitter.controller.db.store as store_mod
import babysitter.controller.loop.admit.maintenance as maint_mod
from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.api.orders import RESET_ORDER
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.fabric.nvlink_domain import INCIDENTS_KEY, is_domain_fault
from babysitter.controller.loop.fabric.nvlink_domain import METRIC as DOMAIN_METRIC
from babysitter.controller.loop.heal import fabric_rung
from babysitter.controller.loop.heal.episode.resetting import RESET_METRIC
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.finding import Finding, job_owned
from babysitter.report import Report
from tests.fixtures.healing import imex_down, not_trained
from tests.fixtures.invariants import (
    CLUSTER_CAP,
    DOMAIN_CAP,
    DOMAIN_OF,
    DOMAINS,
    LEAF_OF,
    LEAVES,
    NAMES,
    PART,
    PARTITION_CAP,
    PREFIX,
    RATE,
    START,
    SWITCH_CAP,
    ClientSlurm,
    Clock,
    Violation,
    automatic,
    someone_elses,
)
from tests.fixtures.invariants_side_doors import MAX_OPEN, SIDE_DOORS, SideDoors, order_book
from tests.summary_lines import SUMMARY

FULL = os.environ.get("BABYSITTER_RELIABILITY") == "full"
CONFIG: dict[str, Any] = {
    "policy": {
        "max_drained_fraction": 1.0,
        "max_drains_per_hour": RATE,
        "resume_after_clean_checks": 2,
    },
    "blast_radius": {
        "switch_count": SWITCH_CAP,
        "partition_count": PARTITION_CAP,
        "cluster_count": CLUSTER_CAP,
        "domain_count": DOMAIN_CAP,
    },
    # a few lines of a job fold (tests/fixtures/invariants_side_doors.py job_flood)
    "controller": {"heartbeat_timeout_s": 10_000_000, "max_open_findings_per_node": MAX_OPEN},
    "slurm": {"node_refresh_s": 0},
    "checks": {"sdc": {"enabled": False}},
    "remediation": {"enabled": True},
    "fabric": {"hold_s": 10},
}


def finding(kind: str, node: str) -> Finding:
    at = Clock.at
    gpu = {"uuid": f"GPU-0003-{node}", "serial": "1650000000003"}
    return {
        "xid79": lambda: Finding(
            check="gpu.xid",
            component="gpu3",
            severity="critical",
            code="xid.79",
            message="XID 79 on GPU 3: fallen off the bus",
            action="reboot",
            details=gpu,
            observed_at=at,
        ),
        "dbe": lambda: Finding(
            check="gpu.memory",
            component="gpu3",
            severity="critical",
            code="ecc.dbe.volatile",
            message="GPU 3: 1 volatile uncorrected ECC error",
            action="reset_gpu",
            details=gpu,
            observed_at=at,
        ),
        "disk": lambda: Finding(
            check="host.disk",
            component="host",
            severity="critical",
            code="disk.readonly",
            message="/ is read-only",
            action="drain",
            observed_at=at,
        ),
        "port": lambda: Finding(
            check="ib.ports",
            component="ib:mlx5_0/1",
            severity="critical",
            code="ib.port_down",
            message="ib:mlx5_0/1 is DOWN (physical Disabled)",
            action="drain",
            observed_at=at,
        ),
        # anyone can print this into a job's log
        "job": lambda: Finding(
            check="nccl.logs",
            component="job:77",
            severity="critical",
            code="nccl.transport_error",
            message="NET/IB : Got completion with status=12 (transport retry counter exceeded)",
            action="drain",
            details={"job_id": "77"},
            observed_at=at,
        ),
        # the node's NVSwitch fabric not trained (Fabric Manager down): a domain's evidence,
        # healed first by the restart_fabric rung (controller/loop/decide/ladder.py FABRIC_RESTART)
        "fabric": lambda: not_trained(2, details={DOMAIN_METRIC: DOMAIN_OF[node]}, observed_at=at),
        # the rack's IMEX domain down: the same, the restart is nvidia-imex's
        "imex": lambda: imex_down(details={DOMAIN_METRIC: DOMAIN_OF[node]}, observed_at=at),
        # a job's log line naming NVLink (and the domain): anyone can print it
        "job_nvlink": lambda: Finding(
            check="nccl.logs",
            component="job:78",
            severity="critical",
            code="nccl.unhandled_system_error",
            message=f"job 78 on {node}: NCCL WARN NVLink fabric {DOMAIN_OF[node]} down: "
            "unhandled system error",
            action="drain",
            details={"job_id": "78", "node": node},
            observed_at=at,
        ),
        # a check that crashed: unknown, not clean
        "crash": lambda: Finding(
            check="gpu.memory",
            component="host",
            severity="warning",
            code="check.error",
            message="check gpu.memory crashed: RuntimeError",
            observed_at=at,
        ),
    }[kind]()


def own(f: Finding) -> bool:
    """A fault of the node's own: not a job's line, not a crashed check (unknown)."""
    return not job_owned(f) and f.code != "check.error"


class Stats:
    """One run's counts, printed at its end (tests/summary_lines.py shows them in `make test`)."""

    sequences = 0
    steps = 0
    changes: dict[str, int] = {}  # what Slurm carried out, by operation (the test did act)
    reached: dict[str, int] = {}  # sequences that reached each situation (REACHED)

    @classmethod
    def clear(cls) -> None:
        cls.sequences, cls.steps, cls.changes, cls.reached = 0, 0, {}, {}


# the situations the invariants are about, counted per sequence that reached them: thousands
# of sequences that never reach a cap would prove nothing about caps
REACHED = (
    "cap",  # a switch, partition or cluster full while a node of it has a fault of its own
    "rate",  # the hour's drain budget spent while a node has a fault of its own
    "outage",  # a tick with slurmctld away while babysitter holds a node
    "takeover",  # an admin drains or resumes a node babysitter holds
    "restart",  # a new controller while babysitter holds a node
    "unreadable",  # a tick with the maintenance windows unreadable while a node has a fault
    "resume",  # babysitter returned a node to service
    "domain_cap",  # an NVLink domain full while a node of it has a fault of its own
    "domain_incident",  # an NVLink domain incident opened (its nodes drained together)
    "domain_closed",  # ... and its nodes resumed together
    "restart_fabric",  # a Fabric Manager / IMEX restart ordered from a node's agent
    "restart_answered",  # ... and the agent answered it (done, refused or failed)
    *SIDE_DOORS,  # issue 49's side doors (tests/fixtures/invariants_side_doors.py)
)
# what babysitter orders from a node's agent instead of asking Slurm (logged as a change)
ORDERS = {ActionKind.RESTART_FABRIC: "restart_fabric", ActionKind.RESET_GPU: "reset_gpu"}
FABRIC_ORDER, ORDERED = fabric_rung.ORDER, "ordered from the agent"
# a node's own faults: a reboot, a GPU reset, a drain (a disk, an IB port), a fabric restart
NODE_FAULTS = ["xid79", "dbe", "disk", "port", "fabric", "imex"]
INCIDENT_REASONS = (f"{PREFIX} switch ", f"{PREFIX} NVLink domain ")


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated database for the module (migrating takes most of a second)."""
    path = tmp_path_factory.mktemp("inv") / "template.db"
    s = Store(f"sqlite:///{path}")
    s.upgrade()
    s.close()
    return path


@pytest.fixture
def clock(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> Iterator[type[Clock]]:
    for mod in (store_mod, ingest_mod, maint_mod, audit_mod):
        monkeypatch.setattr(mod, "now", Clock.now)
    # thousands of sequences log their outages and unreadable windows with tracebacks: what
    # is tested is what Slurm was asked, not the log (kept out of the report's captured log)
    caplog.set_level(logging.CRITICAL, logger="babysitter")
    yield Clock


class World:
    """What the sequences of one run share: one store, on tmpfs where there is one (its fsyncs
    are not what is tested), and the database each sequence starts from (migrated, every node
    reported clean once), copied back into it before each (sqlite's backup: about a millisecond,
    where a new file and a new store per sequence cost 80 ms, most of it SQLAlchemy compiling
    every statement again for a new engine)."""

    def __init__(self, template: Path) -> None:
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = Path(tempfile.mkdtemp(prefix="babysitter-inv-", dir=shm))
        shutil.copy(template, self.dir / "s.db")
        self.store = Store(f"sqlite:///{self.dir / 's.db'}")
        cfg = dict(CONFIG)
        cfg["validation"] = {"output_dir": str(self.dir / "validation")}
        self.cfg = parse_config(cfg)
        self.boot = {n: f"boot-{n}-0" for n in NAMES}
        Clock.at = START
        write_reports(self.store, {n: () for n in NAMES}, self.boot)
        self.fresh = sqlite3.connect(":memory:")
        with self.store.engine.connect() as c:
            c.connection.dbapi_connection.backup(self.fresh)  # type: ignore[union-attr]
        # the orders babysitter gives agents are no Slurm change: each is logged in the
        # sequence's Slurm with the node's reason at that moment (the healer records the order
        # right after the ledger row that hands it out)
        self.slurm: ClientSlurm | None = None
        record = self.store.record_action

        def spy(kind: ActionKind, **kw: Any) -> int:
            aid = record(kind, **kw)
            outcome = str(kw.get("outcome") or "")
            if (
                self.slurm is not None
                and kind in ORDERS
                and kw.get("status") is ActionStatus.DONE
                and outcome.startswith(ORDERED)
            ):
                self.slurm.order(ORDERS[kind], str(kw["node"]))
            return aid

        self.store.record_action = spy  # type: ignore[method-assign]

    def reset(self) -> None:
        with self.store.engine.connect() as c:
            self.fresh.backup(c.connection.dbapi_connection)  # type: ignore[arg-type]
        # the whole database replaced under the store, by sqlite's backup (no statement the
        # store could see): what the tick remembers of it is gone
        self.store.reads.forget()

    def close(self) -> None:
        self.store.close()
        self.fresh.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def write_reports(
    store: Store,
    of: dict[str, tuple[Finding, ...]],
    boot: dict[str, str],
    metrics: dict[str, dict[str, Any]] | None = None,
    no_domain: Collection[str] = (),
) -> None:
    """One report per node, written in one batch by the ingest writer (its fold past MAX_OPEN
    open findings a node); each carries its node's NVLink domain (the gpu.fabric check's
    metric; none from a node in `no_domain`) and `metrics` (an agent's answer)."""
    ReportWriter(store, max_open_findings=MAX_OPEN).write(
        [
            Report(
                node=node,
                report_id=str(uuid.uuid4()),
                sent_at=Clock.at,
                findings=list(findings),
                metrics={
                    "boot_id": boot[node],
                    **({} if node in no_domain else {DOMAIN_METRIC: DOMAIN_OF[node]}),
                    **(metrics or {}).get(node, {}),
                },
            )
            for node, findings in of.items()
        ]
    )


class Safety(SideDoors, RuleBasedStateMachine):
    world: World

    def __init__(self) -> None:
        super().__init__()
        Stats.sequences += 1
        self.world.reset()
        Clock.at = START
        self.store = self.world.store
        self.cfg = copy.deepcopy(self.world.cfg)  # the sequence's own: a reload changes it
        self.slurm = ClientSlurm(dict(PART), {k: list(v) for k, v in LEAVES.items()})
        self.world.slurm = self.slurm
        self.boot = dict(self.world.boot)
        self.last: dict[str, tuple[Finding, ...]] = {n: () for n in NAMES}  # reported clean
        self.node_faulted: set[str] = set()  # ever had a finding of the node's own
        self.incidents: dict[str, set[str]] = {}  # open NVLink domain incidents: their nodes
        self.maintenance_broken = False
        self.broken_ticks: set[int] = set()  # steps whose tick could not read maintenance
        self.seen = 0  # changes already checked for clean evidence
        self.reached: set[str] = set()
        self.side_doors_init(self.world.dir / f"agents-{Stats.sequences}")
        # no tick yet: the first step's tick is the new engine's first (a full pass)
        self.engine: RemediationEngine = make_engine(self.cfg, self.store, slurm=self.slurm)

    def teardown(self) -> None:
        for c in self.slurm.changes:
            op = f"{c.op} (admin)" if c.admin else c.op
            Stats.changes[op] = Stats.changes.get(op, 0) + 1
            if c.op == "resume" and not c.admin:
                self.reached.add("resume")
            if c.op == "resume" and c.reason_before.startswith(INCIDENT_REASONS[1]):
                self.reached.add("domain_closed")
            if c.op == "restart_fabric":
                self.reached.add("restart_fabric")
        self.side_doors_teardown()
        for what in self.reached:
            Stats.reached[what] = Stats.reached.get(what, 0) + 1
        self.world.slurm = None
        self.engine.close()

    # ---- helpers
    def report(self, node: str, *findings: Finding) -> None:
        self.reports({node: findings})

    def reports(
        self,
        of: dict[str, tuple[Finding, ...]],
        tick: bool = False,
        metrics: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """One report per node, in one batch; `tick`: and one loop tick after it (agents
        report while the loop runs)."""
        if of:  # (the writer takes a batch of one report or more)
            write_reports(self.store, of, self.boot, metrics, self.no_domain)
        for node, findings in of.items():
            self.last[node] = findings
            if any(own(f) for f in findings):
                self.node_faulted.add(node)
        if tick:
            self.tick_once()

    def holding(self) -> bool:
        """babysitter holds a node: drained with its reason, or rebooting or validating."""
        return any(automatic(n.reason) for n in self.slurm.all_nodes())

    def wanting(self) -> list[str]:
        """Nodes in service whose latest report has a fault of their own."""
        return [
            n
            for n in NAMES
            if any(own(f) for f in self.last[n])
            and not self.slurm.node_state(n).drained_or_draining
        ]

    def tick_once(self, seconds: float = 10.0) -> None:
        Stats.steps += 1
        Clock.at += timedelta(seconds=seconds)
        self.slurm.step = int(Clock.at.timestamp())
        if self.maintenance_broken:
            self.broken_ticks.add(self.slurm.step)
            if self.wanting() or self.holding():
                self.reached.add("unreadable")
        if self.slurm.unreachable and self.holding():
            self.reached.add("outage")
        self.engine.tick(Clock.at)
        self.after_tick()

    def own_fault(self, node: str, kind: str = "disk") -> Finding:
        return finding(kind, node)

    # ---- rules: the world
    @initialize(
        nodes=st.lists(st.sampled_from(NAMES), max_size=4, unique=True),
        kind=st.sampled_from(NODE_FAULTS),
        validate=st.booleans(),
    )
    def start(self, nodes: list[str], kind: str, validate: bool) -> None:
        """The controller starts on a cluster where some nodes already have a fault (or none):
        a short sequence begins mid-incident, at the caps, where the invariants are tested;
        with `validate`, a node returns only through a validation job (validate_before_resume)."""
        if validate:
            self.validating = self.cfg.policy.validate_before_resume = True
            self.engine.config_reloaded(None)
        self.reports({n: (finding(kind, n),) for n in nodes}, tick=True)

    @rule(node=st.sampled_from(NAMES), kind=st.sampled_from(NODE_FAULTS))
    def fault(self, node: str, kind: str) -> None:
        self.reports({node: (finding(kind, node),)}, tick=True)

    @rule(
        domain=st.sampled_from(sorted(DOMAINS)),
        which=st.lists(st.integers(0, 3), min_size=2, max_size=4, unique=True),
        kind=st.sampled_from(["fabric", "imex"]),
    )
    def domain_faults(self, domain: str, which: list[int], kind: str) -> None:
        """Several nodes of one NVLink domain lose their fabric at once (a switch tray, the
        rack's IMEX): a domain incident, not a drain each."""
        nodes = [DOMAINS[domain][i] for i in which]
        self.reports({n: (finding(kind, n),) for n in nodes}, tick=True)

    @rule(domain=st.sampled_from(sorted(DOMAINS)), times=st.integers(1, 2))
    def domain_clean(self, domain: str, times: int) -> None:
        """Every node of a domain reports clean (twice: the clean streak a resume needs)."""
        for _ in range(times):
            self.reports({n: () for n in DOMAINS[domain]}, tick=True)

    @rule(domain=st.sampled_from(sorted(DOMAINS)))
    def job_nvlink_line(self, domain: str) -> None:
        """A job's log line naming NVLink and the domain, on every node of the domain."""
        self.reports({n: (finding("job_nvlink", n),) for n in DOMAINS[domain]}, tick=True)

    @rule(nodes=st.lists(st.sampled_from(NAMES), min_size=2, max_size=4, unique=True))
    def faults_together(self, nodes: list[str]) -> None:
        """Faults arriving several at once (a rack, a switch)."""
        kind = "port" if len(nodes) > 2 else "xid79"
        self.reports({n: (finding(kind, n),) for n in nodes}, tick=True)

    @rule(nodes=st.lists(st.sampled_from(NAMES), min_size=1, max_size=8, unique=True))
    def job_owned_line(self, nodes: list[str]) -> None:
        self.reports({n: (finding("job", n),) for n in nodes}, tick=True)

    @rule(node=st.sampled_from(NAMES))
    def check_crash(self, node: str) -> None:
        self.reports({node: (finding("crash", node),)}, tick=True)

    @rule(node=st.sampled_from(NAMES))
    def clean_report(self, node: str) -> None:
        self.reports({node: ()}, tick=True)

    @rule()
    def all_clean(self) -> None:
        self.reports({n: () for n in NAMES}, tick=True)

    @rule(seconds=st.sampled_from([10, 30, 120, 600]))
    def tick(self, seconds: int) -> None:
        self.tick_once(seconds)

    @rule(ticks=st.integers(1, 4))
    def ticks(self, ticks: int) -> None:
        for _ in range(ticks):
            self.tick_once(30)

    @rule(up=st.booleans())
    def slurmctld(self, up: bool) -> None:
        """slurmctld goes away (every call fails) or comes back."""
        self.slurm.unreachable = not up

    @rule(ticks=st.integers(1, 2), back=st.booleans())
    def outage(self, ticks: int, back: bool) -> None:
        """slurmctld goes away for a tick or two, mid-whatever, and maybe comes back."""
        self.slurm.unreachable = True
        for _ in range(ticks):
            self.tick_once(30)
        self.slurm.unreachable = not back

    @rule(what=st.sampled_from(["boot", "passed", "failed"]))
    def nodes_event(self, what: str) -> None:
        """The reboots Slurm was asked for happen (each agent reports its new boot, clean), or
        the running validation jobs end."""
        for node in NAMES:
            if what != "boot":
                self.end_validation(node, "COMPLETED" if what == "passed" else "FAILED")
            elif "REBOOT_REQUESTED" in self.slurm.node_state(node).flags:
                self.slurm.finish_reboot(node)
                self.boot[node] = str(uuid.uuid4())
                self.report(node)

    @rule(answer=st.sampled_from(["done", "refused", "failed", "silent"]))
    def agents_answer(self, answer: str) -> None:
        """Each agent with an order out (a Fabric Manager / IMEX restart, a GPU reset: what the
        answer to its report hands it, controller/api/orders.py) answers it in its next report:
        done (the fault gone with it), refused (processes on the GPUs), failed (the service
        down after its restart), or not at all (past `reset_timeout_s`)."""
        # the hand-out's expiry on the model's clock, not the wall clock
        book = order_book(self.store)
        book.refresh()
        of: dict[str, tuple[Finding, ...]] = {}
        metrics: dict[str, dict[str, Any]] = {}
        for node in NAMES:
            part = book.answer_part(node)
            for o in json.loads(part.partition(b":")[2]) if part else []:
                metric = {FABRIC_ORDER: fabric_rung.METRIC, RESET_ORDER: RESET_METRIC}.get(
                    o["check"]
                )
                # the agent's gate (agent/order_gate.py): taken before, or refused
                if metric is None:
                    continue
                took = self.take(node, o)
                if took == "taken" or answer == "silent":
                    continue
                ok = answer == "done" and took == "carry_out"
                of[node] = () if ok else self.last[node]
                metrics.setdefault(node, {})[metric] = {
                    "order": o["id"],
                    "ok": ok,
                    "refused": answer == "refused" or took == "refused",
                    "message": {
                        "done": "restarted",
                        "refused": "refused: 1 process(es) on GPU 0",
                        "failed": "failed after its restart",
                    }[answer],
                }
                if metric == fabric_rung.METRIC:
                    self.reached.add("restart_answered")
        self.reports(of, metrics=metrics)
        self.tick_once(310 if answer == "silent" else 10)

    # ---- rules: admins
    @rule(
        node=st.sampled_from(NAMES),
        what=st.sampled_from(["scontrol drain", "scontrol resume", "drain", "resume"]),
    )
    def admin(self, node: str, what: str) -> None:
        """An admin at `scontrol`, or through babysitter (`babysitter drain|resume NODE`: what
        the API records for the loop), at any point of an episode."""
        self._admin(node, what)

    @rule(i=st.integers(0, 7), what=st.sampled_from(["scontrol drain", "drain", "resume"]))
    def takeover(self, i: int, what: str) -> None:
        """An admin takes over (or resumes) a node babysitter holds, whichever stage it is at."""
        held = [n.name for n in self.slurm.all_nodes() if automatic(n.reason)] or NAMES
        self._admin(held[i % len(held)], what)

    def _admin(self, node: str, what: str) -> None:
        if automatic(self.slurm.node_state(node).reason):
            self.reached.add("takeover")
        if what == "scontrol drain":
            self.slurm.scontrol_drain(node, "fan replaced, testing [root@head]")
        elif what == "scontrol resume":
            self.slurm.scontrol_resume(node)
        else:
            self.store.record_action(
                ActionKind(what),
                node=node,
                reason="cable check" if what == "drain" else None,
                rule=Rule.MANUAL,
                requested_by="admin",
            )

    @rule(
        nodes=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True),
        what=st.sampled_from(["start", "end", "unreadable", "readable"]),
    )
    def maintenance(self, nodes: list[str], what: str) -> None:
        if what == "start":
            self.engine.maintenance.start(
                nodes, ",".join(nodes), Clock.at + timedelta(minutes=20), "firmware", "admin"
            )
            self.windows.update(dict.fromkeys(nodes, Clock.at + timedelta(minutes=20)))
        elif what == "end":
            self.engine.maintenance.end(nodes, "admin")
            for n in nodes:
                self.windows.pop(n, None)
        else:
            self.maintenance_broken = what == "unreadable"
            self._maintenance_reads()

    def _maintenance_reads(self) -> None:
        if self.maintenance_broken:

            def fail(now: datetime) -> set[str]:
                raise RuntimeError("database is locked")

            self.engine._maintenance = fail  # type: ignore[method-assign]
        else:
            self.engine.__dict__.pop("_maintenance", None)

    @rule()
    def controller_restart(self) -> None:
        """A new controller on the same store (a restart, a leader change)."""
        if self.holding():
            self.reached.add("restart")
        self.engine.close()
        self.engine = make_engine(self.cfg, self.store, slurm=self.slurm)
        self._maintenance_reads()

    # ---- the invariants
    @invariant()
    def caps_hold(self) -> None:
        drained = [n for n in self.slurm.drained_by(automatic)]
        # what took each node out of service: a switch incident is not held by its own
        # switch's cap (a node fault found on it later changes its reason, not that)
        origin = {
            c.node: c.reason_after
            for c in self.slurm.changes
            if c.op == "drain" and not c.drained_before
        }
        per_part: dict[str, int] = {}
        per_leaf: dict[str, int] = {}
        per_domain: dict[str, int] = {}
        for n in drained:
            per_part[PART[n.name]] = per_part.get(PART[n.name], 0) + 1
            # an incident (a switch's, a domain's) is one fault: the switch and domain caps
            # hold the node policy's drains (docs/fabric.md), the others hold incidents too
            if not origin.get(n.name, n.reason).startswith(INCIDENT_REASONS):
                per_leaf[LEAF_OF[n.name]] = per_leaf.get(LEAF_OF[n.name], 0) + 1
                per_domain[DOMAIN_OF[n.name]] = per_domain.get(DOMAIN_OF[n.name], 0) + 1
        state = {n.name: n.reason for n in drained}
        self._note_cap(len(drained), per_part, per_leaf, per_domain)
        if len(drained) > CLUSTER_CAP:
            raise Violation(f"cluster cap {CLUSTER_CAP} exceeded: {state}")
        for p, k in per_part.items():
            if k > PARTITION_CAP:
                raise Violation(f"partition {p} cap {PARTITION_CAP} exceeded: {state}")
        for leaf, k in per_leaf.items():
            if k > SWITCH_CAP:
                raise Violation(f"switch {leaf} cap {SWITCH_CAP} exceeded: {state}")
        for domain, k in per_domain.items():
            if k > DOMAIN_CAP:
                raise Violation(f"NVLink domain {domain} cap {DOMAIN_CAP} exceeded: {state}")

    def _note_cap(
        self,
        total: int,
        per_part: dict[str, int],
        per_leaf: dict[str, int],
        per_domain: dict[str, int],
    ) -> None:
        """A cap is reached when its scope is full while a node of it has a fault of its own."""
        for n in self.wanting():
            if per_domain.get(DOMAIN_OF[n], 0) >= DOMAIN_CAP:
                self.reached.add("domain_cap")
            if (
                total >= CLUSTER_CAP
                or per_part.get(PART[n], 0) >= PARTITION_CAP
                or per_leaf.get(LEAF_OF[n], 0) >= SWITCH_CAP
                or per_domain.get(DOMAIN_OF[n], 0) >= DOMAIN_CAP
            ):
                self.reached.add("cap")

    def _new_drains(self) -> list[Any]:
        return [
            c
            for c in self.slurm.changes
            if c.op == "drain"
            and not c.admin
            and not c.drained_before
            and automatic(c.reason_after)
            # a node that failed its validation, or had no verdict before its reservation ended
            # (validation.py), goes back to where it was: already counted
            and not c.reason_after.startswith(
                (f"{PREFIX} validation failed", f"{PREFIX} validation: no verdict")
            )
        ]

    @invariant()
    def drain_rate_holds(self) -> None:
        at = [c.seq for c in self._new_drains()]
        if sum(x > self.slurm.step - 3600 for x in at) >= RATE and self.wanting():
            self.reached.add("rate")
        for t in at:
            window = [x for x in at if t - 3600 < x <= t]
            if len(window) > RATE:
                raise Violation(f"{len(window)} automatic drains within an hour (budget {RATE})")

    @invariant()
    def nothing_automatic_on_someone_elses_node(self) -> None:
        for c in self.slurm.changes:
            if not c.admin and someone_elses(c.reason_before):
                raise Violation(
                    f"automatic {c.op} of {c.node}, held by someone else ({c.reason_before!r})"
                )

    @invariant()
    def job_owned_evidence_never_drains(self) -> None:
        for c in self._new_drains():
            if c.node not in self.node_faulted:
                raise Violation(f"{c.node} drained ({c.reason_after!r}) on no evidence of its own")

    @invariant()
    def job_owned_evidence_never_opens_a_domain_incident(self) -> None:
        """A node joins an NVLink domain incident (opened or grown) only on its own fabric
        reading in its latest report: a job's line naming NVLink on every node of a domain
        correlates nothing."""
        got = {str(i["switch"]): set(i["nodes"]) for i in self.store.kv_get(INCIDENTS_KEY) or []}
        for domain, nodes in got.items():
            self.reached.add("domain_incident")
            for n in nodes - self.incidents.get(domain, set()):
                if not any(is_domain_fault(f) for f in self.last[n]):
                    raise Violation(
                        f"{n} joined NVLink domain {domain}'s incident on no fabric reading "
                        f"of its own: {[f.code for f in self.last[n]]}"
                    )
        self.incidents = got

    @invariant()
    def no_resume_without_clean_evidence(self) -> None:
        # the changes of the last step, against the reports made before it (a step either
        # reports or ticks)
        new, self.seen = self.slurm.changes[self.seen :], len(self.slurm.changes)
        for c in new:
            if c.op != "resume" or c.admin:
                continue
            dirty = [f.code for f in self.last.get(c.node, ()) if not job_owned(f)]
            if dirty:
                raise Violation(f"{c.node} resumed on a report that was not clean: {dirty}")

    @invariant()
    def no_new_action_while_maintenance_unreadable(self) -> None:
        for c in self.slurm.changes:
            if c.seq not in self.broken_ticks or c.admin:
                continue
            if (
                c.op in ("reboot", "validate", "resume", *ORDERS.values())
                or c in self._new_drains()
            ):
                raise Violation(f"automatic {c.op} of {c.node} while maintenance was unreadable")


def focused(name: str, rules: str) -> type[Safety]:
    """The machine with only these rules: in short sequences, the situations they make are
    reached far more often than among all the rules (every invariant is checked alike)."""
    keep = set(rules.split())
    every = {r.function.__name__ for r in Safety.setup_state().rules}
    assert keep <= every, keep - every
    return type(f"Safety_{name}", (Safety,), dict.fromkeys(every - keep))


# by focus: caps against outages and restarts; admins taking over (and back) mid-episode;
# evidence (job lines, crashed checks, clean reports) against maintenance windows
FOCUS: dict[str, type[Safety]] = {
    "all": Safety,
    "caps": focused(
        "caps",
        "fault faults_together domain_faults all_clean tick outage controller_restart nodes_event "
        "reload_caps old_agent",
    ),
    "ownership": focused(
        "ownership",
        "fault faults_together clean_report tick admin takeover nodes_event outage agents_answer "
        "healthcheck_drain window_over_order agent_restart verdicts",
    ),
    "evidence": focused(
        "evidence",
        "fault job_owned_line job_nvlink_line check_crash clean_report all_clean tick maintenance "
        "nodes_event job_flood verdicts",
    ),
    # NVLink domains and the restart_fabric rung: domain incidents opening and closing, job
    # lines naming NVLink, agents answering their orders, admins taking over mid-order
    "fabric": focused(
        "fabric",
        "fault domain_faults domain_clean job_nvlink_line agents_answer nodes_event takeover "
        "controller_restart old_validation window_over_order agent_restart verdicts",
    ),
}

# the broken-cap tests' machine: the caps' rules only (no side door reports first)
CAPS_ONLY = focused(
    "caps_only",
    "fault faults_together domain_faults all_clean tick outage controller_restart nodes_event",
)


def _run(
    world: World, machine: type[Safety], examples: int, steps: int, seed: int, shrink: bool = True
) -> None:
    machine.world = world
    phases = list(Phase) if shrink else [Phase.generate]

    def factory() -> Safety:
        return machine()

    run_state_machine_as_test(
        # a fixed seed: the same sequences every run, so a failure is reproducible
        hypothesis.seed(seed)(factory),  # type: ignore[arg-type]  # (a factory works too)
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=phases,
        ),
    )


def summary(focus: str, steps: int, seconds: float) -> str:
    done = ", ".join(f"{k} {v}" for k, v in sorted(Stats.changes.items()))
    reached = ", ".join(f"{k} {Stats.reached.get(k, 0)}" for k in REACHED)
    return (
        f"safety invariants ({focus}): {Stats.sequences} sequences of {steps} steps, "
        f"{Stats.steps} engine ticks over {len(NAMES)} nodes in {seconds:.0f} s; sequences "
        f"that reached: {reached}; Slurm carried out: {done}"
    )


# (sequences, steps) per focus and seed. make test: short sequences, many of them (each step
# runs the real engine on a real store: about 25 ms a tick); make reliability: long ones
RUNS: dict[str, tuple[int, int]] = (
    {
        "all": (3000, 50),
        "caps": (2000, 20),
        "ownership": (2000, 20),
        "evidence": (2000, 20),
        "fabric": (2000, 20),
    }
    if FULL
    else {
        "all": (150, 10),
        "caps": (300, 6),
        "ownership": (300, 6),
        "evidence": (250, 6),
        "fabric": (300, 10),
    }
)


@pytest.mark.reliability
# room for hypothesis to shrink a failure to its shortest sequence (a pass needs far less)
@pytest.mark.timeout(3600 if FULL else 900)
@pytest.mark.parametrize("focus", list(RUNS))
def test_safety_invariants_hold_over_generated_sequences(
    focus, template_db, clock, record_property
):
    examples, steps = RUNS[focus]
    world = World(template_db)
    Stats.clear()
    t0 = time.monotonic()
    try:
        _run(world, FOCUS[focus], examples, steps, seed=list(RUNS).index(focus))
    finally:
        world.close()
        record_property(SUMMARY, summary(focus, steps, time.monotonic() - t0))


def test_a_broken_cap_is_caught(template_db, clock, monkeypatch):
    """The machine is not blind: a cap off by one (every scope lets one more node go, at
    decision and at execution alike) is found as a violated invariant."""
    from babysitter.controller.loop.decide import blast

    limit = blast.Cap.limit
    monkeypatch.setattr(blast.Cap, "limit", lambda self, size: limit(self, size) + 1)
    world = World(template_db)
    Stats.clear()
    try:
        with pytest.raises(Violation, match="cap"):
            _run(world, CAPS_ONLY, 200, 8, seed=0, shrink=False)
    finally:
        world.close()


def test_a_broken_domain_cap_is_caught(template_db, clock, monkeypatch):
    """The new scope is watched too: the NVLink domain cap off by one at the admission step
    (a third node of a domain drained by the node policy, every other cap intact) is found."""
    from babysitter.controller.loop.decide import blast

    class OffByOne(blast.Cap):
        def limit(self, size: int) -> int:
            return super().limit(size) + 1

    build = blast.BlastSettings.from_config

    def broken(cfg: Any) -> blast.BlastSettings:
        b = build(cfg)
        return replace(b, domain=OffByOne(b.domain.fraction, b.domain.count))

    monkeypatch.setattr(blast.BlastSettings, "from_config", staticmethod(broken))
    world = World(template_db)
    Stats.clear()
    try:
        with pytest.raises(Violation, match=r"NVLink domain .* cap"):
            _run(world, CAPS_ONLY, 200, 8, seed=0, shrink=False)
    finally:
        world.close()
