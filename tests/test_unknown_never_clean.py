"""A node returns to service only on positive evidence of health (issue 42): a report whose
checks crashed or could not read their source (`check.error`, `<check>.nvml_error`, an
unreadable file) says nothing about the node. Before, such a report counted as clean (it held
only warnings), and after 3 of them a node drained for a double-bit ECC error was resumed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.store import Store
from babysitter.controller.loop.remediation import make_engine
from babysitter.finding import Finding, no_verdict
from babysitter.report import Report
from bench.slurm_standin import InMemorySlurm

DBE = Finding(
    check="gpu.ecc",
    component="gpu0",
    severity="critical",
    code="ecc.dbe.volatile",
    message="GPU 0: 1 volatile uncorrected ECC error",
    action="reset_gpu",
)
CRASHED = Finding(
    check="gpu.ecc",
    component="host",
    severity="warning",
    code="check.error",
    message="check gpu.ecc failed: RuntimeError: boom",
    action="inspect",
)
NVML_ERROR = Finding(
    check="gpu.ecc",
    component="gpu0",
    severity="warning",
    code="ecc.nvml_error",
    message="GPU 0: NVML error reading gpu.ecc: Unknown Error",
    action="inspect",
)
UNREADABLE = Finding(
    check="xid.kmsg",
    component="host",
    severity="warning",
    code="kmsg.unreadable",
    message="cannot read /dev/kmsg: Permission denied",
    action="inspect",
)

# the fabric and recovery checks' own "could not tell" (issue 41): systemctl without an
# answer, an IMEX domain status unparsable, a fabric state or recovery action unknown
UNKNOWNS_41 = [
    Finding(
        check="gpu.fabric",
        component="host",
        severity="warning",
        code=code,
        message=f"{code}: no answer",
        action="watch",
    )
    for code in ("fabric_manager.unknown", "imex.unknown", "imex.domain_unknown")
] + [
    Finding(
        check=check,
        component="gpu0",
        severity="warning",
        code=code,
        message=f"GPU 0: {code}",
        action="inspect",
    )
    for check, code in (
        ("gpu.fabric", "fabric.state_unknown"),
        ("gpu.recovery", "recovery.unknown"),
        ("gpu.nvlink", "nvlink.state_unknown"),
    )
]


def report(node: str, *findings: Finding, kind: str = "full") -> Report:
    return Report(
        node=node,
        report_id=str(uuid.uuid4()),
        sent_at=datetime.now(UTC),
        findings=list(findings),
        metrics={},
        kind=kind,
    )


def test_the_one_shot_and_the_controller_ask_one_predicate():
    from babysitter.cli import check_run

    assert check_run.no_verdict is no_verdict
    assert all(no_verdict(f) for f in (CRASHED, NVML_ERROR, UNREADABLE))
    assert not no_verdict(DBE)


@pytest.mark.parametrize(
    "unknown", [CRASHED, NVML_ERROR, UNREADABLE, *UNKNOWNS_41], ids=lambda f: f.code
)
def test_a_node_whose_checks_crash_is_never_resumed(tmp_path: Path, unknown: Finding):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    slurm = InMemorySlurm(["n1", "n2", "n3", "n4"])
    cfg = parse_config(
        {
            "policy": {
                "max_drained_fraction": 1.0,
                "resume_after_clean_checks": 3,
                "validate_before_resume": False,
            },
            "remediation": {"enabled": False},
            "slurm": {"node_refresh_s": 0, "job_scan_s": 0},
        }
    )
    eng = make_engine(cfg, store, slurm=slurm)
    writer = ReportWriter(store)

    def tick() -> None:
        eng.tick(datetime.now(UTC))  # the node's reports are fresh: its verdict is its own

    def drained() -> bool:
        return slurm.node("n1").drained_or_draining

    writer.write([report("n1", DBE)])
    tick()
    assert drained()
    # the DBE is gone from the reports, but the check that would see it crashes: unknown
    for _ in range(5):
        writer.write([report("n1", unknown)])
        tick()
        assert drained()
        assert (store.node("n1") or {})["consecutive_clean"] == 0
    # an event report of it (sent at once, between full reports) is no clean step either
    writer.write([report("n1", kind="full")])
    writer.write([report("n1", unknown, kind="event")])
    assert (store.node("n1") or {})["consecutive_clean"] == 0
    # positive evidence: three reports that checked and found nothing
    for _ in range(3):
        assert drained()
        writer.write([report("n1")])
        tick()
    assert not drained()
