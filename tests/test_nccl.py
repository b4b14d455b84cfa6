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
from babysitter.finding import job_owned

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
    chk.local_jobs = lambda: frozenset({"4242"})  # running here
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


# ---- each agent reads only the logs of the jobs on its own node (issue 42)

RETRY = "transport retry counter exceeded\n"


def shared_glob(tmp_path: Path, jobs: dict[int, str]) -> NcclLogCheck:
    """One shared scratch glob, as docs/checks.md shows it: every job's log matches on every
    node. `jobs`: job id -> what the job printed."""
    for job, text in jobs.items():
        (tmp_path / f"slurm-{job}.out").write_text(text)
    cfg = parse_config({"checks": {"nccl": {"job_log_globs": [str(tmp_path / "slurm-*.out")]}}})
    return NcclLogCheck(CheckContext(cfg, "node3"))


def test_a_node_reports_only_the_jobs_running_on_it(tmp_path):
    chk = shared_glob(tmp_path, {11: RETRY, 12: RETRY, 13: "fine\n"})
    chk.local_jobs = lambda: frozenset({"12", "13"})
    assert [(f.component, f.code) for f in chk.run()] == [("job:12", "nccl.transport_error")]


def test_an_unknown_job_list_reads_no_log_at_all(tmp_path):
    chk = shared_glob(tmp_path, {11: RETRY, 12: RETRY})
    chk.local_jobs = lambda: None
    [f] = chk.run()
    # a node-level warning (issue 42: as info the controller dropped it, and the node whose
    # job-log scoping failed was silent), never a job's finding
    assert (f.code, f.severity, f.component) == ("nccl.logs_skipped", "warning", "host")
    assert not job_owned(f)
    chk.local_jobs = lambda: frozenset()  # known: no job here
    assert chk.run() == []


def test_a_job_that_just_ended_still_has_its_last_lines_read(tmp_path):
    # NCCL prints its failure right before the job dies: by the next scan the job has left
    # listpids, yet the line is this node's job's (issue 42 follow-up)
    from babysitter.checks.nccl.local_jobs import RecentJobs

    chk = shared_glob(tmp_path, {12: "step 1\n"})
    now = [0.0]
    chk.recent = RecentJobs(grace_s=600.0, clock=lambda: now[0])
    chk.local_jobs = lambda: frozenset({"12"})
    assert chk.run() == []
    with (tmp_path / "slurm-12.out").open("a") as f:
        f.write(RETRY)
    chk.local_jobs = lambda: frozenset()  # the job ended
    now[0] += 30.0
    assert [(f.component, f.code) for f in chk.run()] == [("job:12", "nccl.transport_error")]
    with (tmp_path / "slurm-12.out").open("a") as f:
        f.write("NCCL WARN NET/IB : Got completion with error 12, opcode 0\n" + RETRY)
    now[0] += 601.0  # long gone: no longer this node's
    assert chk.run() == []


def fake_scontrol(tmp_path: Path, body: str) -> str:
    exe = tmp_path / "scontrol"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


LISTPIDS = """PID      JOBID    STEPID LOCALID GLOBALID
4711     77       batch  0       0
4712     77       batch  -       -
4800     78       0      0       0
"""


def test_the_jobs_on_the_node_come_from_its_slurmd(tmp_path):
    from babysitter.checks.nccl.local_jobs import jobs_on_node, parse_listpids

    assert parse_listpids(LISTPIDS) == {"77", "78"}
    assert parse_listpids("garbage") is None
    assert parse_listpids(LISTPIDS + "oops\n") is None
    args = tmp_path / "args"
    ok = fake_scontrol(tmp_path, f'echo "$@" > {args}; cat <<EOF\n{LISTPIDS}EOF')
    assert jobs_on_node("node3", ok) == {"77", "78"}
    assert args.read_text().split() == ["listpids", "*", "node3"]
    none = fake_scontrol(
        tmp_path,
        'echo "PID      JOBID    STEPID LOCALID GLOBALID"; '
        'echo "No job steps exist on this node." >&2; exit 1',
    )
    assert jobs_on_node("node3", none) == frozenset()
    # a step that ended between the listing and the question (or a stale socket): the other
    # steps' rows are still this node's jobs, not an unknown answer
    partial = fake_scontrol(
        tmp_path,
        f'cat <<EOF\n{LISTPIDS}EOF\necho "Unable to connect to slurmstepd" >&2; exit 1',
    )
    assert jobs_on_node("node3", partial) == {"77", "78"}
    header_only = fake_scontrol(
        tmp_path,
        'echo "PID      JOBID    STEPID LOCALID GLOBALID"; '
        'echo "Unable to connect to slurmstepd" >&2; exit 1',
    )
    assert jobs_on_node("node3", header_only) is None
    broken = fake_scontrol(tmp_path, 'echo "scontrol: error: Could not establish" >&2; exit 1')
    assert jobs_on_node("node3", broken) is None
    assert jobs_on_node("node3", str(tmp_path / "missing")) is None
    # the agent's [slurm] bin_dir and slurm_conf reach it
    conf = tmp_path / "slurm.conf"
    fake_scontrol(tmp_path, f'echo "$SLURM_CONF" > {args}; cat <<EOF\n{LISTPIDS}EOF')
    cfg = parse_config(
        {
            "checks": {"nccl": {"job_log_globs": [str(tmp_path / "slurm-*.out")]}},
            "slurm": {"bin_dir": str(tmp_path), "slurm_conf": str(conf)},
        }
    )
    assert NcclLogCheck(CheckContext(cfg, "node3")).local_jobs() == {"77", "78"}
    assert args.read_text().strip() == str(conf)
