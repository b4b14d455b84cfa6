"""A babysat job whose own NCCL reports a network failure (issue 51: "a babysat job whose NCCL
reports the link error is still requeued at once"): requeued once from its checkpoint, running
or just FAILED, against its max_requeues; its nodes are never touched. A job that did not opt
in is left to Slurm, and a collective timeout (what any stall looks like) requeues nothing.
The real remediation engine over the in-memory Slurm, fed by the real job-log scanner reading
NCCL lines collected from public issue threads (tests/data/world/nccl/samples.jsonl); one case
against the devcluster's real Slurm 22.05."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from babysitter.checks.nccl.check import JobLogScanner
from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.node.facts_model import NodeFacts
from babysitter.controller.loop.jobs.nccl_requeue import (
    STALE_S,
    decide_nccl_requeue,
    network_failures,
)
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.finding import Finding, Severity
from babysitter.report import Report
from babysitter.slurm.cli import CliSlurmClient
from babysitter.slurm.client import SlurmJob
from bench.slurm_standin import InMemorySlurm
from tests.fixtures.slurm import node_state, submit, wait_for

SAMPLES = Path(__file__).parent / "data" / "world" / "nccl" / "samples.jsonl"
JOB = 7001
NODE_OPS = frozenset(
    {"drain", "drain_many", "resume", "resume_many", "reboot", "cancel_reboot", "hold_idle"}
    | {"hold_for_validation", "start_validation", "reserve_maintenance"}
)
NODES = ["n1", "n2", "n3"]
# what bench/soak.py injects as a user's benign noise: a collective timeout
WATCHDOG = (
    "[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out."
)


def sample(sample_id: str) -> str:
    for raw in SAMPLES.read_text().splitlines():
        s = json.loads(raw)
        if s["id"] == sample_id:
            return str(s["text"])
    raise KeyError(sample_id)


# NVIDIA/nccl#928 (NCCL 2.10-2.18 wording) and NVIDIA/nccl#902 (<= 2.9), as printed
IB_COMPLETION = sample("ib-err4-peer-928")
IB_COMPLETION_OLD = sample("ib-err12-old-902")


def job_finding(tmp_path: Path, node: str, line: str, job: int = JOB) -> Finding:
    """What `node`'s job-log check reports of a line in the job's shared log."""
    log = tmp_path / f"slurm-{job}-{uuid.uuid4().hex}.out"
    log.write_text(f"step 1200 loss 2.31\n{line}\n")
    [f] = JobLogScanner().scan(str(job), log, node)
    return f


def report(store: Store, node: str, *findings: Finding) -> None:
    ReportWriter(store).write(
        [
            Report(
                node=node,
                report_id=str(uuid.uuid4()),
                sent_at=datetime.now(UTC),
                findings=list(findings),
                metrics={},
            )
        ]
    )


class Fleet:
    """The remediation engine, a store and the in-memory Slurm, on a clock of its own."""

    def __init__(self, tmp_path: Path, store: Store | None = None, **policy: object) -> None:
        self.tmp = tmp_path
        self.store = store or Store(f"sqlite:///{tmp_path / 'n.db'}")
        self.store.upgrade()
        self.slurm = InMemorySlurm(NODES)
        self.eng = self.engine(**policy)
        self.t = datetime.now(UTC)

    def engine(self, **policy: object) -> RemediationEngine:
        cfg = parse_config(
            {"slurm": {"node_refresh_s": 0, "job_scan_s": 0}, "policy": dict(policy)}
        )
        return make_engine(cfg, self.store, slurm=self.slurm)

    def job(self, states: tuple[str, ...], babysit: str = "babysit", **kw: object) -> None:
        self.slurm.add_job(
            SlurmJob(
                JOB,
                name="train",
                states=states,
                nodes=("n1", "n2"),
                batch_host="n1",
                comment=babysit,
                user="alice",
                **kw,  # type: ignore[arg-type]
            )
        )

    def report(self, node: str, *findings: Finding) -> None:
        report(self.store, node, *findings)

    def both_report(self, line: str) -> None:
        """Every node of the job reads the shared log: each reports the line."""
        for n in ("n1", "n2"):
            self.report(n, job_finding(self.tmp, n, line))
        self.report("n3")

    def tick(self, seconds: float = 1.0) -> None:
        self.t += timedelta(seconds=seconds)
        self.eng.tick(self.t)

    def requeues(self) -> list[str]:
        return [target for op, target in self.slurm.calls if op == "requeue"]

    def node_changes(self) -> list[tuple[str, str]]:
        """What babysitter asked Slurm to do to a node (reads and job requeues left out)."""
        return [c for c in self.slurm.calls if c[0] in NODE_OPS]

    def history(self) -> list[dict[str, object]]:
        [row] = [r for r in self.store.jobs() if r["job_id"] == JOB]
        return list(row.get("history") or [])  # type: ignore[arg-type]

    def close(self) -> None:
        self.eng.close()
        self.store.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    yield f
    f.close()


def test_running_babysat_job_requeued_once_and_its_nodes_untouched(fleet: Fleet):
    fleet.job(("RUNNING",))
    fleet.both_report(IB_COMPLETION)
    fleet.tick()
    assert fleet.requeues() == [str(JOB)]  # at once: the tick that saw it
    [a] = [a for a in fleet.store.actions() if a.kind == "requeue"]
    assert a.rule == "job_nccl_network" and a.status == "done" and a.node is None
    assert a.reason == f"its NCCL reported a network failure: {IB_COMPLETION}"
    # the node: never drained, resumed or otherwise changed; the job keeps every node
    assert fleet.node_changes() == []
    assert not [n for n in fleet.slurm.nodes() if n.drained_or_draining]
    assert fleet.slurm.job(JOB).excluded_nodes == ()
    [row] = [r for r in fleet.store.jobs() if r["job_id"] == JOB]
    assert row["requeues"] == 1
    [requeue] = [h for h in fleet.history() if h["event"] == "requeue"]
    assert requeue["why"] == f"its NCCL reported a network failure: {IB_COMPLETION}"
    assert [h["outcome"] for h in fleet.history() if h["event"] == "nccl_failure"] == [
        "requeue queued"
    ]


def test_babysat_job_that_already_failed_of_it_is_requeued(fleet: Fleet):
    fleet.job(("FAILED",))
    fleet.both_report(IB_COMPLETION_OLD)
    fleet.tick()
    assert fleet.requeues() == [str(JOB)]
    assert fleet.slurm.job(JOB).pending and fleet.slurm.job(JOB).restart_count == 1
    assert fleet.node_changes() == []


def test_job_that_did_not_opt_in_is_left_to_slurm(fleet: Fleet):
    fleet.job(("FAILED",), babysit="")
    fleet.both_report(IB_COMPLETION)
    for _ in range(3):
        fleet.tick()
    assert fleet.requeues() == [] and fleet.node_changes() == []
    assert [a for a in fleet.store.actions() if a.kind == "requeue"] == []
    assert not [r for r in fleet.store.jobs() if r["job_id"] == JOB]


def test_a_collective_timeout_requeues_nothing(fleet: Fleet):
    """The soak's benign noise: any stall ends in a watchdog timeout; the network is not named."""
    fleet.job(("FAILED",))
    fleet.both_report(WATCHDOG)
    for _ in range(3):
        fleet.tick()
    assert fleet.requeues() == [] and fleet.node_changes() == []


def test_the_same_failure_in_later_reports_requeues_once(fleet: Fleet, tmp_path: Path):
    fleet.job(("RUNNING",))
    fleet.both_report(IB_COMPLETION)
    fleet.tick()
    # the requeued job runs again (on the same nodes: nothing excluded them); the same line is
    # read again and again: later reports, the next run's node reading the appended log from
    # its start, an agent restart; also long after the requeue and by a restarted controller
    fleet.job(("RUNNING",), restart_count=1)
    for gap in (1.0, 1.0, 30.0, 2 * STALE_S):
        fleet.both_report(IB_COMPLETION)
        fleet.tick(gap)
    fleet.eng.close()
    fleet.eng = fleet.engine()
    fleet.both_report(IB_COMPLETION)
    fleet.tick()
    assert fleet.requeues() == [str(JOB)]
    assert fleet.slurm.job(JOB).running


def test_a_line_of_the_run_before_read_after_the_requeue_does_not_requeue_again(fleet: Fleet):
    """A node fault requeued the job; its peers' NCCL lines of that run reach the controller
    after the job restarted: the previous run's last words, not a new failure."""
    fleet.job(("RUNNING",))
    fleet.tick()
    fleet.eng.jobs.record_requeue(JOB, ["n2"], "node n2 is DOWN", now=fleet.t)
    fleet.tick()
    assert fleet.requeues() == [str(JOB)]
    fleet.job(("RUNNING",), restart_count=1)
    fleet.both_report(IB_COMPLETION)
    fleet.tick(STALE_S / 3)
    assert fleet.requeues() == [str(JOB)]
    [seen] = [h for h in fleet.history() if h["event"] == "nccl_failure"]
    assert "previous run" in str(seen["outcome"])


def test_max_requeues_respected(tmp_path: Path):
    fleet = Fleet(tmp_path)
    try:
        fleet.job(("RUNNING",), babysit="babysit=max_requeues=1")
        fleet.both_report(IB_COMPLETION)
        fleet.tick()
        fleet.job(("FAILED",), babysit="babysit=max_requeues=1", restart_count=1)
        fleet.both_report(IB_COMPLETION_OLD)  # the next run failed too: a new failure
        fleet.tick(2 * STALE_S)
        assert fleet.requeues() == [str(JOB), str(JOB)]
        [row] = [r for r in fleet.store.jobs() if r["job_id"] == JOB]
        assert row["requeues"] == 1  # the second was requeued held: off the queue for a human
        assert [h["event"] for h in fleet.history() if h["event"] in ("requeue", "held")] == [
            "requeue",
            "held",
        ]
        assert [a for a in fleet.store.alerts() if a["condition"] == f"job_requeue_limit_{JOB}"]
        assert fleet.node_changes() == []
    finally:
        fleet.close()


def test_a_requeue_held_for_the_link_grace_goes_at_once_when_nccl_gives_up(fleet: Fleet):
    """The port is down on n1 (its own finding): the requeue waits for the link grace; the
    job's NCCL gives up first and it dies: requeued now, off the node whose port is down."""
    fleet.job(("RUNNING",))
    fleet.tick()
    until = fleet.t + timedelta(seconds=30)
    fleet.eng.jobs.record_requeue(JOB, ["n1"], "n1: ib.port_down", hold_until=until, now=fleet.t)
    port_down = Finding(
        check="ib.ports",
        component="ib:mlx5_0/1",
        severity=Severity.CRITICAL,
        code="ib.port_down",
        message="ib:mlx5_0/1 is DOWN (physical Polling)",
    )
    fleet.job(("FAILED",))
    fleet.report("n1", port_down, job_finding(fleet.tmp, "n1", IB_COMPLETION))
    fleet.tick()
    assert fleet.requeues() == [str(JOB)] and fleet.t < until
    [a] = [a for a in fleet.store.actions() if a.kind == "requeue"]
    assert a.rule == "job_nccl_network" and a.status == "done"
    assert fleet.slurm.job(JOB).excluded_nodes == ("n1",)


def test_only_the_link_class_of_a_jobs_own_log_counts(tmp_path: Path):
    own = job_finding(tmp_path, "n1", IB_COMPLETION)
    timeout = job_finding(tmp_path, "n1", WATCHDOG)
    assert timeout.code == "nccl.watchdog_timeout"
    node_line = Finding(
        check="ib.ports",
        component="ib:mlx5_0/1",
        severity=Severity.CRITICAL,
        code="nccl.transport_error",  # not the job's own: never a job's requeue
        message="not from a job",
    )
    facts = [
        NodeFacts(name=n, open_findings=fs, consecutive_clean=0, heartbeat_age_s=1.0)
        for n, fs in (("n2", (own, timeout)), ("n1", (node_line,)))
    ]
    [(job, failure)] = network_failures(facts).items()
    assert job == JOB and failure.line == IB_COMPLETION and failure.nodes == ("n2",)


@pytest.mark.parametrize(
    ("phase", "since", "dry", "kind"),
    [
        ("running", None, False, "requeue"),
        ("failed", STALE_S + 1, False, "requeue"),
        ("ended", None, False, "skip"),
        ("running", STALE_S - 1, False, "skip"),
        ("failed", None, True, "skip"),
    ],
)
def test_decision(phase, since, dry, kind):
    assert decide_nccl_requeue(phase, "X", since, dry).kind == kind


def test_real_slurm_requeues_the_failed_babysat_job(clean_cluster, tmp_path):
    """Slurm 22.05 takes a FAILED batch job back to PENDING (`scontrol requeue`) while
    slurmctld still holds it (MinJobAge); its node stays as it was."""
    cl = CliSlurmClient(slurm_conf=Path(clean_cluster.slurm_conf))
    job = submit(clean_cluster, "--comment=babysit=max_requeues=2", wrap="exit 1")
    wait_for(lambda: "FAILED" in cl.job(job).states, 30, "the job failed")
    node = cl.job(job).nodes[0]
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.upgrade()
    cfg = parse_config({"slurm": {"slurm_conf": clean_cluster.slurm_conf}})
    eng = make_engine(cfg, store, slurm=cl)
    try:
        report(store, node, job_finding(tmp_path, node, IB_COMPLETION, job))
        eng.tick()
        wait_for(lambda: cl.job(job).restart_count == 1, 30, "the job requeued")
        assert node_state(clean_cluster, node)[0] in ("idle", "alloc", "mix")
        [a] = [a for a in store.actions() if a.kind == "requeue"]
        assert a.status == "done" and a.rule == "job_nccl_network"
    finally:
        eng.close()
        store.close()
