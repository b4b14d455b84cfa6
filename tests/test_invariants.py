"""The safety invariants (docs/policy.md, "Safety invariants") against sequences nobody wrote by
hand: a hypothesis rule-based state machine drives the REAL remediation engine (policy, fabric
step, healer, validator, executor, admission) over an in-memory Slurm (tests/fixtures/
invariants.py) and a SQLite store, through faults and clears, job-owned log lines, check
crashes, Slurm outages, admin drains and resumes (in Slurm and through babysitter) mid-episode,
maintenance windows and unreadable ones, reboots completing and controller restarts, and checks
every invariant after every step:

- no cap is exceeded: babysitter's automatic drains per switch, partition and cluster, and
  new automatic drains per rolling hour;
- no automatic change of a node someone else holds (an admin's `[manual]` drain included);
- a node whose only evidence is job-owned is never drained;
- no automatic resume without clean evidence (the node's latest report clean);
- while the maintenance windows cannot be read, no new automatic action.

`make test` runs a bounded number of sequences (derandomized: the same ones every run);
`make reliability` (BABYSITTER_RELIABILITY=full) many more. A deliberately broken cap is caught
(test_a_broken_cap_is_caught)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

import babysitter.controller.api.ingest as ingest_mod
import babysitter.controller.db.audit as audit_mod
import babysitter.controller.db.store as store_mod
import babysitter.controller.loop.maintenance as maint_mod
from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.actions import ActionKind
from babysitter.controller.db.store import Store
from babysitter.controller.loop.policy import Rule, job_owned
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.finding import Finding
from babysitter.report import Report
from tests.fixtures.invariants import PREFIX, InvariantSlurm, automatic, someone_elses

FULL = os.environ.get("BABYSITTER_RELIABILITY") == "full"
NAMES = [f"node{i}" for i in range(1, 9)]
PART = {n: ("a" if i <= 4 else "b") for i, n in enumerate(NAMES, 1)}
# the leaves cross the partitions: a switch cap and a partition cap are different scopes
LEAVES = {
    "leaf1": ["node1", "node2", "node5", "node6"],
    "leaf2": ["node3", "node4", "node7", "node8"],
}
LEAF_OF = {n: leaf for leaf, ns in LEAVES.items() for n in ns}
SWITCH_CAP, PARTITION_CAP, CLUSTER_CAP, RATE = 2, 2, 3, 4
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
    },
    "controller": {"heartbeat_timeout_s": 10_000_000},
    "slurm": {"node_refresh_s": 0},
    "checks": {"sdc": {"enabled": False}},
    "remediation": {"enabled": True},
    "fabric": {"hold_s": 10},
}


class Clock:
    """The one clock of a run: the engine's ticks, the store's stamps and the reports'."""

    at = datetime.now(UTC)

    @classmethod
    def now(cls) -> datetime:
        return cls.at


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


class Stats:
    sequences = 0
    steps = 0
    changes: dict[str, int] = {}  # what Slurm carried out, by operation (the test did act)


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated database, copied for each sequence (migrating is the slow part)."""
    path = tmp_path_factory.mktemp("inv") / "template.db"
    s = Store(f"sqlite:///{path}")
    s.upgrade()
    s.close()
    return path


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Clock]]:
    for mod in (store_mod, ingest_mod, maint_mod, audit_mod):
        monkeypatch.setattr(mod, "now", Clock.now)
    yield Clock


class Violation(AssertionError):
    pass


class Safety(RuleBasedStateMachine):
    template: Path

    def __init__(self) -> None:
        super().__init__()
        Stats.sequences += 1
        Clock.at = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
        # on tmpfs where there is one: the store's fsyncs are not what is tested
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = Path(tempfile.mkdtemp(prefix="babysitter-inv-", dir=shm))
        shutil.copy(self.template, self.dir / "s.db")
        self.store = Store(f"sqlite:///{self.dir / 's.db'}")
        self.slurm = InvariantSlurm(dict(PART), {k: list(v) for k, v in LEAVES.items()})
        cfg = dict(CONFIG)
        cfg["validation"] = {"output_dir": str(self.dir / "validation")}
        self.cfg = parse_config(cfg)
        self.boot = {n: str(uuid.uuid4()) for n in NAMES}
        self.last: dict[str, tuple[Finding, ...]] = {}
        self.node_faulted: set[str] = set()  # ever had a finding of the node's own
        self.maintenance_broken = False
        self.broken_ticks: set[int] = set()  # steps whose tick could not read maintenance
        self.seen = 0  # changes already checked for clean evidence
        self.reports({n: () for n in NAMES})
        self.engine: RemediationEngine = make_engine(self.cfg, self.store, slurm=self.slurm)
        self.tick_once()

    def teardown(self) -> None:
        for c in self.slurm.changes:
            op = f"{c.op} (admin)" if c.admin else c.op
            Stats.changes[op] = Stats.changes.get(op, 0) + 1
        self.engine.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- helpers
    def report(self, node: str, *findings: Finding) -> None:
        self.reports({node: findings})

    def reports(self, of: dict[str, tuple[Finding, ...]], tick: bool = False) -> None:
        """One report per node, written in one batch as the ingest writer does; `tick`: and
        one loop tick after it (agents report while the loop runs)."""
        ReportWriter(self.store).write(
            [
                Report(
                    node=node,
                    report_id=str(uuid.uuid4()),
                    sent_at=Clock.at,
                    findings=list(findings),
                    metrics={"boot_id": self.boot[node]},
                )
                for node, findings in of.items()
            ]
        )
        for node, findings in of.items():
            self.last[node] = findings
            if any(not job_owned(f) and f.code != "check.error" for f in findings):
                self.node_faulted.add(node)
        if tick:
            self.tick_once()

    def tick_once(self, seconds: float = 10.0) -> None:
        Stats.steps += 1
        Clock.at += timedelta(seconds=seconds)
        self.slurm.step = int(Clock.at.timestamp())
        if self.maintenance_broken:
            self.broken_ticks.add(self.slurm.step)
        self.engine.tick(Clock.at)

    # ---- rules: the world
    @rule(node=st.sampled_from(NAMES), kind=st.sampled_from(["xid79", "dbe", "disk", "port"]))
    def fault(self, node: str, kind: str) -> None:
        self.reports({node: (finding(kind, node),)}, tick=True)

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
    def slurm(self, up: bool) -> None:
        """slurmctld goes away (every call fails) or comes back."""
        self.slurm.unreachable = not up

    @rule(what=st.sampled_from(["boot", "passed", "failed"]))
    def nodes_event(self, what: str) -> None:
        """The reboots Slurm was asked for happen (each agent reports its new boot, clean), or
        the running validation jobs end."""
        for node in NAMES:
            if what != "boot":
                self.slurm.verdict(node, "COMPLETED" if what == "passed" else "FAILED")
            elif "REBOOT_REQUESTED" in self.slurm.node_state(node).flags:
                self.slurm.finish_reboot(node)
                self.boot[node] = str(uuid.uuid4())
                self.report(node)

    # ---- rules: admins
    @rule(
        node=st.sampled_from(NAMES),
        what=st.sampled_from(["scontrol drain", "scontrol resume", "drain", "resume"]),
    )
    def admin(self, node: str, what: str) -> None:
        """An admin at `scontrol`, or through babysitter (`babysitter drain|resume NODE`: what
        the API records for the loop), at any point of an episode."""
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
        elif what == "end":
            self.engine.maintenance.end(nodes, "admin")
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
        for n in drained:
            per_part[PART[n.name]] = per_part.get(PART[n.name], 0) + 1
            if not origin.get(n.name, n.reason).startswith(f"{PREFIX} switch "):
                per_leaf[LEAF_OF[n.name]] = per_leaf.get(LEAF_OF[n.name], 0) + 1
        state = {n.name: n.reason for n in drained}
        if len(drained) > CLUSTER_CAP:
            raise Violation(f"cluster cap {CLUSTER_CAP} exceeded: {state}")
        for p, k in per_part.items():
            if k > PARTITION_CAP:
                raise Violation(f"partition {p} cap {PARTITION_CAP} exceeded: {state}")
        for leaf, k in per_leaf.items():
            if k > SWITCH_CAP:
                raise Violation(f"switch {leaf} cap {SWITCH_CAP} exceeded: {state}")

    def _new_drains(self) -> list[Any]:
        return [
            c
            for c in self.slurm.changes
            if c.op == "drain"
            and not c.admin
            and not c.drained_before
            and automatic(c.reason_after)
            # a node that failed its validation goes back to where it was: already counted
            and not c.reason_after.startswith(f"{PREFIX} validation failed")
        ]

    @invariant()
    def drain_rate_holds(self) -> None:
        at = [c.seq for c in self._new_drains()]
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
            if c.op in ("reboot", "validate", "resume") or c in self._new_drains():
                raise Violation(f"automatic {c.op} of {c.node} while maintenance was unreadable")


def _run(template: Path, examples: int, steps: int, shrink: bool = True) -> None:
    Safety.template = template
    Stats.sequences, Stats.steps, Stats.changes = 0, 0, {}
    phases = list(Phase) if shrink else [Phase.generate]
    run_state_machine_as_test(
        Safety,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize=True,  # the same sequences every run: a failure is reproducible
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=phases,
        ),
    )


def _report(capsys: pytest.CaptureFixture[str], steps: int) -> None:
    with capsys.disabled():
        done = ", ".join(f"{k} {v}" for k, v in sorted(Stats.changes.items()))
        print(
            f"\nsafety invariants: {Stats.sequences} sequences of up to {steps} steps, "
            f"{Stats.steps} engine ticks over {len(NAMES)} nodes; Slurm carried out: {done}"
        )


# make test: 150 sequences (about a minute: each step runs the real engine on a real
# store); make reliability: 20 times as many, longer
EXAMPLES, STEPS = (3000, 50) if FULL else (150, 30)


@pytest.mark.reliability
# room for hypothesis to shrink a failure to its shortest sequence (a pass needs far less)
@pytest.mark.timeout(3600 if FULL else 900)
def test_safety_invariants_hold_over_generated_sequences(template_db, clock, capsys):
    try:
        _run(template_db, EXAMPLES, STEPS)
    finally:
        _report(capsys, STEPS)


def test_a_broken_cap_is_caught(template_db, clock, monkeypatch):
    """The machine is not blind: a cap off by one (every scope lets one more node go, at
    decision and at execution alike) is found as a violated invariant."""
    from babysitter.controller.loop import blast

    limit = blast.Cap.limit
    monkeypatch.setattr(blast.Cap, "limit", lambda self, size: limit(self, size) + 1)
    with pytest.raises(Violation, match="cap"):
        _run(template_db, 200, STEPS, shrink=False)
