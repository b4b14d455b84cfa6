"""NCCL: the all_reduce_perf parser and thresholds (run through a stand-in program that prints
real-format nccl-tests output, since there are no GPUs here), and the passive job-log scan."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from babysitter.checks.base import CheckContext
from babysitter.checks.nccl.check import NcclLogCheck, NcclPerfCheck, parse_all_reduce_perf
from babysitter.config import parse_config

DATA = Path(__file__).parent / "data" / "nccl"


def perf_check(**nccl) -> NcclPerfCheck:
    cfg = parse_config(
        {
            "agent": {"hardware_profile": "h100-sxm"},
            "checks": {
                "nccl": {
                    "all_reduce_perf": str(DATA / "all_reduce_perf_standin"),
                    **nccl,
                }
            },
        }
    )
    return NcclPerfCheck(CheckContext(cfg, "node1"))


def test_parser_reads_rows_and_average():
    rows, avg = parse_all_reduce_perf((DATA / "h100_healthy.txt").read_text())
    assert len(rows) == 5 and rows[0].size == 1073741824 and rows[-1].busbw_oop == 482.0
    assert avg is not None and 470 < avg < 475


def test_healthy_h100_passes(monkeypatch):
    """all_reduce_perf is a stand-in printing real-format output."""
    monkeypatch.setenv("STANDIN_SAMPLE", str(DATA / "h100_healthy.txt"))
    [f] = perf_check().run()
    assert f.severity == "ok" and f.details["measured_gbps"] == 482.4


def test_slow_fabric_reports_measured_vs_expected(monkeypatch):
    """all_reduce_perf is a stand-in printing real-format output."""
    monkeypatch.setenv("STANDIN_SAMPLE", str(DATA / "h100_slow.txt"))
    [f] = perf_check().run()
    assert f.code == "nccl.busbw_low" and f.severity == "warning"
    assert f.details["measured_gbps"] == 302.3 and f.details["expected_gbps"] == 460.0


def test_failed_run_is_a_finding(monkeypatch):
    monkeypatch.setenv("STANDIN_SAMPLE", os.devnull)
    monkeypatch.setenv("STANDIN_RC", "3")
    [f] = perf_check().run()
    assert f.code == "nccl.perf_failed"


@given(st.text(max_size=2000))
def test_parser_takes_garbage(text):
    parse_all_reduce_perf(text)


def test_watchdog_timeout_in_a_job_log_is_a_finding_on_that_job(tmp_path):
    log = tmp_path / "slurm-4242.out"
    log.write_text("step 10 loss 2.3\n")
    cfg = parse_config({"checks": {"nccl": {"job_log_globs": [str(tmp_path / "slurm-*.out")]}}})
    chk = NcclLogCheck(CheckContext(cfg, "node3"))
    assert chk.run() == []
    with log.open("a") as f:
        f.write(
            "[rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=1042, OpType=ALLREDUCE) ran for 600042 "
            "milliseconds before timing out.\n"
        )
    [f] = chk.run()
    assert f.component == "job:4242" and f.code == "nccl.watchdog_timeout"
    assert f.details["node"] == "node3" and f.severity == "critical"
    assert chk.run() == []  # reported once
