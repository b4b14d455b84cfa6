"""Paths beside the admission step that broke a safety invariant (issue 49, side doors 1 and 2,
and the policy's own no-verdict rule): the ingest's fold of a job's hundreds of log lines, a
HealthCheckProgram drain arriving while a validation runs, and a clean streak that a crashed
check did not reset."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from babysitter.checks.nccl.check import JobLogScanner
from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.api.node_state import FOLDED_CODE
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.node.decisions import DecisionKind
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.node.policy import decide
from babysitter.controller.loop.heal.validation import AWAITING, Validator
from babysitter.controller.loop.record.alerts import Alert
from babysitter.controller.loop.remediation import make_engine
from babysitter.finding import Action, Finding, Severity, job_owned
from babysitter.report import Report
from babysitter.slurm.base import OwnedClient
from babysitter.slurm.client import SlurmJob, SlurmNode, SlurmNotOwned
from babysitter.slurm.ownership import HEALTHCHECK_MARK, ReasonOwner
from bench.slurm_standin import InMemorySlurm

JOB = 4242
WATCHDOG = (
    "[rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=52, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600051 milliseconds before timing out."
)


# ---- side door 1: the ingest's fold never turns a job's own lines into a node's finding


def _job_logs(tmp_path: Path, node: str, files: int) -> list[Finding]:
    """What a node's NCCL log check reports for a job that wrote `files` step logs
    (`slurm-<id>.<n>.out`), each with the watchdog's line: one critical per file."""
    scanner, out = JobLogScanner(), []
    for n in range(files):
        log = tmp_path / node / f"slurm-{JOB}.{n}.out"
        log.parent.mkdir(exist_ok=True)
        log.write_text(f"step {n}\n{WATCHDOG}\n")
        out.extend(scanner.scan(str(JOB), log, node))
    return out


def _xid(k: int) -> Finding:
    return Finding(
        check="xid.nvml",
        component=f"gpu{k % 8}",
        severity=Severity.CRITICAL,
        code=f"xid.{k}",
        message=f"XID {k}",
        action=Action.REBOOT,
    )


def test_a_job_writing_hundreds_of_log_files_drains_none_of_its_nodes(tmp_path: Path):
    """300 watchdog lines per node, past the 256 open findings a node keeps: the fold counts
    them in a job-owned summary, so no node is drained; a node with its own criticals past the
    cap (n3) is drained as before, its worst severity surviving the fold."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    nodes = ["n1", "n2", "n3"]
    slurm = InMemorySlurm(nodes)
    job = SlurmJob(JOB, "train", ("RUNNING",), nodes=tuple(nodes), batch_host="n1", user="mallory")
    slurm.add_job(job)
    cfg = parse_config(
        {
            "policy": {"max_drained_fraction": 1.0, "max_drains_per_hour": 1000},
            "slurm": {"node_refresh_s": 0, "job_scan_s": 0},
        }
    )
    eng = make_engine(cfg, store, slurm=slurm)
    findings = {n: _job_logs(tmp_path, n, 300) for n in nodes}
    assert len(findings["n1"]) == 300 and all(map(job_owned, findings["n1"]))
    findings["n3"] = findings["n3"] + [_xid(k) for k in range(300)]
    t0 = datetime.now(UTC)
    for step in range(3):
        ReportWriter(store).write(
            [
                Report(
                    node=n,
                    report_id=str(uuid.uuid4()),
                    sent_at=datetime.now(UTC),
                    findings=findings[n],
                    metrics={},
                )
                for n in nodes
            ]
        )
        eng.tick(t0 + timedelta(seconds=40 * step))
    assert eng.sender.flush()

    drained = {n.name: n.reason for n in slurm.nodes() if n.drained_or_draining}
    assert sorted(drained) == ["n3"], drained
    n1 = store.node("n1")
    assert n1 is not None and len(n1["open_findings"]) <= 256
    (fold,) = [f for f in n1["open_findings"] if f.code == FOLDED_CODE]
    assert job_owned(fold) and fold.details["folded"] == 300 - 255
    n3 = store.node("n3")
    assert n3 is not None and len(n3["open_findings"]) <= 256
    folds = {job_owned(f): f for f in n3["open_findings"] if f.code == FOLDED_CODE}
    assert folds[False].severity is Severity.CRITICAL  # the node's own, folded: still counts
    conditions = {a["condition"]: a["state"] for a in store.alerts()}
    assert conditions.get(f"job_log_{JOB}") == "firing", conditions


# ---- side door 2: a HealthCheckProgram drain is the check's, never the validator's

CHECK_REASON = f"babysitter: {HEALTHCHECK_MARK} gpu.memory: GPU 3: 1 volatile DBE"


class _Slurm(OwnedClient):
    """An OwnedClient (the ownership rules every backend shares) over nodes held in memory,
    with one validation job whose verdict the test sets."""

    def __init__(self, reason: str) -> None:
        super().__init__("babysitter:")
        self.nodes_ = {"n1": SlurmNode("n1", "IDLE", frozenset(), reason)}
        self.changed: list[str] = []
        self.outcome = ("RUNNING", "")

    def nodes(self) -> list[SlurmNode]:
        return list(self.nodes_.values())

    def _set_drain(self, node: str, reason: str) -> None:
        self.changed.append(f"drain {reason}")
        self.nodes_[node] = SlurmNode(node, "IDLE", frozenset({"DRAIN"}), reason)

    def _set_resume(self, node: str) -> None:
        self.changed.append("resume")
        self.nodes_[node] = SlurmNode(node, "IDLE", frozenset(), "")

    def validation_outcome(self, job_id: int) -> tuple[str, str]:
        return self.outcome

    def end_validation(self, reservation: str) -> None:
        self.changed.append(f"end {reservation}")

    def check_drain(self, reason: str) -> None:
        """`babysitter check --slurm-drain` on the node, in Slurm: its mark, no validator."""
        self.nodes_["n1"] = SlurmNode("n1", "IDLE", frozenset({"DRAIN"}), reason)


def _validating(tmp_path: Path, slurm: _Slurm, outcome: str | None = None) -> Validator:
    """A validation job running on n1, recorded as the validator records it."""
    cfg = parse_config({"validation": {"output_dir": str(tmp_path)}})
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    store.upgrade()
    store.record_action(
        ActionKind.VALIDATE,
        node="n1",
        job_id=77,
        reason="fault gone",
        status=ActionStatus.RUNNING,
        outcome=outcome,
    )
    return Validator(cfg, store, slurm)


@pytest.mark.parametrize(
    ("state", "code", "outcome"),
    [
        ("FAILED", "1:0", None),  # a failed verdict: the validator would drain it again
        ("COMPLETED", "0:0", AWAITING),  # drained for its verdict, passed: it would resume it
    ],
)
def test_a_healthcheck_drain_during_a_validation_is_never_rewritten_or_resumed(
    tmp_path: Path, state: str, code: str, outcome: str | None
):
    slurm = _Slurm("")
    v = _validating(tmp_path, slurm, outcome)
    slurm.check_drain(CHECK_REASON)  # the HealthCheckProgram drains n1 mid-validation
    slurm.outcome = (state, code)
    firing: list[Alert] = []
    v.poll(datetime.now(UTC), firing, [])
    assert slurm.nodes_["n1"].reason == CHECK_REASON
    assert slurm.nodes_["n1"].drained_or_draining
    assert [c for c in slurm.changed if not c.startswith("end ")] == []


def test_the_slurm_client_changes_a_healthcheck_drain_only_for_the_check(tmp_path: Path):
    """Automatic drains (an incident's batch, a validation's verdict), resumes and reboots are
    refused on the check's drain; the check itself re-reasons and resumes its own drain, and
    never the controller's."""
    slurm = _Slurm(CHECK_REASON)
    assert isinstance(slurm.drain_many(["n1"], "switch leaf1 suspected")["n1"], SlurmNotOwned)
    assert isinstance(slurm.resume_many(["n1"])["n1"], SlurmNotOwned)
    with pytest.raises(SlurmNotOwned):
        slurm.reboot("n1", "reboot: xid 79", "DOWN")
    assert slurm.changed == []
    check = _Slurm(CHECK_REASON)
    check.acting_as = ReasonOwner.HEALTHCHECK
    check.drain("n1", f"{HEALTHCHECK_MARK} gpu.memory: GPU 3: 2 volatile DBE")
    check.resume("n1")
    assert check.changed == [f"drain {CHECK_REASON.replace('1 volatile', '2 volatile')}", "resume"]
    check.check_drain("babysitter: gpu.xid: XID 79")  # the controller's own drain
    assert isinstance(check.resume_many(["n1"])["n1"], SlurmNotOwned)


# ---- the pure policy: no return while a check gave no verdict

CLUSTER = ClusterFacts(partition_sizes={"default": 10})


@pytest.mark.parametrize(
    "code",
    ["check.error", "fabric_manager.unknown", "kmsg.unreadable", "gpu.nvml_error"],
)
@pytest.mark.parametrize("validate", [False, True])
def test_no_resume_while_a_no_verdict_finding_is_open_whatever_the_streak(
    code: str, validate: bool
):
    """A warning that said nothing about the node (a crashed check, an unknown state, a source
    it could not read): the facts claim 5 clean reports, the policy still neither resumes nor
    validates the node."""
    unknown = Finding(
        check=code.rsplit(".", 1)[0] or "check",
        component="host",
        severity=Severity.WARNING,
        code=code,
        message="no verdict",
        action=Action.INSPECT,
    )
    n = NodeFacts(
        "n1",
        consecutive_clean=5,
        heartbeat_age_s=1,
        drained=True,
        ours=True,
        reason="babysitter: gpu.xid: XID 79",
        open_findings=[unknown],
    )
    s = PolicySettings(validate_before_resume=validate)
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    got = decide([n], CLUSTER, s, now).decisions
    kinds = {d.kind for d in got if d.node == "n1"}
    assert not kinds & {DecisionKind.RESUME, DecisionKind.VALIDATE}, kinds
    # and with the finding gone, the same streak returns it
    back = decide([replace(n, open_findings=[])], CLUSTER, s, now)
    expected = DecisionKind.VALIDATE if validate else DecisionKind.RESUME
    assert expected in {d.kind for d in back.decisions if d.node == "n1"}
