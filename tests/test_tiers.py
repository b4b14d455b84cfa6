"""Polling tiers and NVML events, through the real agent process on the fake libnvidia-ml.

The agent ships to a controller URL where nothing listens, so every report lands in its spool:
the spool is what the agent would have sent, in order."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from babysitter.checks.base import CheckContext
from babysitter.checks.gpu.check import GpuMemoryCheck
from babysitter.config import parse_config
from babysitter.devcluster.fakenvml import EVENT_DBE, EVENT_XID, read_calls
from tests.fixtures.controller import free_port
from tests.fixtures.gpu import babysitter_env, run_babysitter
from tests.fixtures.slurm import wait_for


def spooled(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        try:
            rows = db.execute("SELECT body FROM spool ORDER BY seq").fetchall()
        except sqlite3.OperationalError:  # file created, table not yet
            return []
    return [json.loads(r[0]) for r in rows]


def findings(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for r in reports for f in r["findings"]]


def test_a_gpu_without_ecc_events_gets_its_dbe_through_the_fast_tier(gpus, fakenvml_lib, tmp_path):
    # GPU 2 supports only XID events (NOT_SUPPORTED for ECC events, as some boards say);
    # GPU 4 supports the default mask, ECC events included.
    gpus.supported_events(2, EVENT_XID)
    token = tmp_path / "node.token"
    token.write_text("t")
    token.chmod(0o600)  # the agent refuses a token others can read
    spool = tmp_path / "spool.db"
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        agent__controller_url=f"http://127.0.0.1:{free_port()}",
        agent__node_name="n1",
        agent__token_file=str(token),
        agent__spool_path=str(spool),
        agent__request_timeout_s="0.5",
        agent__enabled_checks='["gpu.presence", "gpu.memory"]',
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "babysitter.cli.main", "agent"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # the first full report comes after the event thread registered
        wait_for(lambda: any(r["kind"] == "full" for r in spooled(spool)), 60, "first report")
        gpus.set(2, dbe_volatile=1)
        gpus.event(2, EVENT_DBE)  # not delivered: GPU 2 could not register for it
        gpus.event(4, EVENT_DBE)  # delivered at once, before any poll sees a counter
        wait_for(
            lambda: (
                {("gpu2", "ecc.dbe.volatile"), ("gpu4", "ecc.dbe.event")}
                <= {(f["component"], f["code"]) for f in findings(spooled(spool))}
            ),
            30,
            "DBE on gpu2 (fast tier) and gpu4 (event)",
        )
    finally:
        agent.terminate()
        agent.wait(timeout=20)
    reports = spooled(spool)
    got = findings(reports)
    # the default report interval is 30 s: what arrived came from the immediate paths
    assert sum(r["kind"] == "full" for r in reports) <= 3
    assert not [f for f in got if f["component"] == "gpu2" and f["code"] == "ecc.dbe.event"]
    dbe4 = next(f for f in got if f["component"] == "gpu4" and f["code"] == "ecc.dbe.event")
    assert dbe4["severity"] == "critical" and dbe4["check"] == "gpu.events"
    assert [r for r in reports if r["kind"] == "event"]
    tiers = reports[-1]["metrics"]["tiers"]
    assert tiers["runs"]["fast"] >= 1 and tiers["nvml_calls"]["fast"] >= 1


def test_the_tier_of_a_signal_is_configuration(tmp_path):
    cfg = parse_config({})
    chk = GpuMemoryCheck(CheckContext(cfg, "n"))
    assert {"dbe_volatile", "row_remap"} <= chk.fast_signals()
    assert "sbe_volatile" not in chk.fast_signals()
    assert chk.effective_interval() == cfg.agent.fast_interval_s
    cfg = parse_config(
        {
            "checks": {
                "gpu": {
                    "signal_intervals": {
                        "gpu.memory/sbe_volatile": "fast",
                        "gpu.memory/dbe_volatile": 15,
                        "gpu.memory/row_remap": 15,
                    }
                }
            }
        }
    )
    chk = GpuMemoryCheck(CheckContext(cfg, "n"))
    assert chk.fast_signals() == {"sbe_volatile"}
    # a run reads only the due signals; the first run reads them all
    assert chk.begin(now=1000.0) == set(chk.signal_intervals())
    assert chk.begin(now=1001.0) == {"sbe_volatile"}
    assert chk.tier == "fast"


def test_the_fake_counts_nvml_calls(gpus, fakenvml_lib, tmp_path):
    calls = tmp_path / "calls"
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    env.update(gpus.env(fakenvml_lib, calls=calls))
    r = run_babysitter(env, "check", "--json", "--only", "gpu.memory")
    assert r.returncode == 0, r.stderr
    n = read_calls(calls)
    # 8 GPUs: one volatile DBE read each, among the rest
    assert n["nvmlDeviceGetTotalEccErrors"] >= 8
    assert n["nvmlDeviceGetRemappedRows"] == 8


def test_the_loop_wakes_for_the_next_run_of_a_check_that_is_still_running(tmp_path):
    """Regression: the loop used to skip running checks when choosing how long to sleep, so a
    fast-tier check that was still running then waited for the next slow one (seconds)."""
    import time

    from babysitter.agent.daemon import Agent

    token = tmp_path / "token"
    token.write_text("t")
    token.chmod(0o600)  # the agent refuses a token others can read
    cfg = parse_config(
        {
            "agent": {
                "token_file": str(token),
                "spool_path": str(tmp_path / "spool.db"),
                "enabled_checks": ["host.resources"],
            },
            "checks": {"host": {"interval_s": 1.0, "check_slurmd": False}},
        }
    )
    agent = Agent(cfg)
    [check] = agent.checks
    now = time.monotonic()
    agent._due[check.name] = now + 1.0
    agent._running[check.name] = now  # started this instant, will end long before its due
    assert agent.next_wake() <= 1.0
    agent._due[check.name] = now - 0.5  # overdue and still running: its end wakes the loop
    assert agent.next_wake() > 0.5


def test_a_slow_signal_is_read_again_at_its_next_grid_point_after_a_start():
    """The agent runs checks on a grid of their interval; a signal read at start-up between two
    grid points is read again at the next point of its own grid, not an interval after the
    start (it used to be skipped there and read up to 1.5 intervals after the first read)."""
    chk = GpuMemoryCheck(CheckContext(parse_config({}), "n"))
    assert chk.signal_intervals()["retired_pending"] == 60.0
    assert "retired_pending" in chk.begin(now=1000.2)  # start-up: everything
    assert "retired_pending" not in chk.begin(now=1001.0)
    assert "retired_pending" in chk.begin(now=1020.0)  # 17 x 60: its next grid point
    assert "retired_pending" not in chk.begin(now=1021.0)
    assert "retired_pending" in chk.begin(now=1080.0)


def test_an_nvlink_that_goes_down_is_reported_by_the_fast_tier(gpus, fakenvml_lib, tmp_path):
    """Link state is one batched field read per GPU in the fast tier: the agent reports a link
    that went down without waiting for the per-link scan (which it never needs here)."""
    token = tmp_path / "node.token"
    token.write_text("t")
    token.chmod(0o600)
    spool = tmp_path / "spool.db"
    calls = tmp_path / "calls"
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        agent__controller_url=f"http://127.0.0.1:{free_port()}",
        agent__node_name="n1",
        agent__token_file=str(token),
        agent__spool_path=str(spool),
        agent__request_timeout_s="0.5",
        agent__enabled_checks='["gpu.presence", "gpu.nvlink"]',
    )
    env["FAKE_NVML_CALLS"] = str(calls)
    agent = subprocess.Popen(
        [sys.executable, "-m", "babysitter.cli.main", "agent"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: any(r["kind"] == "full" for r in spooled(spool)), 60, "first report")
        gpus.set(6, nvlink_down="11")
        wait_for(
            lambda: any(
                f["component"] == "nvlink:gpu6/11" and f["severity"] == "critical"
                for f in findings(spooled(spool))
            ),
            60,
            "NVLink 11 of GPU 6 reported down",
        )
    finally:
        agent.terminate()
        agent.wait(timeout=20)
    counts = read_calls(calls)
    assert counts.get("nvmlDeviceGetNvLinkState", 0) == 0  # never the per-link scan
    assert counts["nvmlDeviceGetFieldValues"] > 2 * 8  # the fast tier read the states again
    # the default report interval is 30 s: the report came from the fast tier's immediate path
    assert sum(r["kind"] == "full" for r in spooled(spool)) <= 3
