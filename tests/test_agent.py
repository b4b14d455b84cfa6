"""The agent daemon and durable shipping, against a real controller subprocess."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from babysitter.agent.spool import Spool
from babysitter.controller.db.store import Store
from tests.fixtures.controller import (
    ControllerProcess,
    Secrets,
    controller_config,
    free_port,
    offline_agent_config,
)
from tests.fixtures.slurm import wait_for


def agent_env(
    secrets: Secrets, tmp_path: Path, url: str, node: str = "node1", interval: float = 0.3
) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("BABYSITTER_CONFIG", None)
    env.update(
        {
            "BABYSITTER_AGENT__CONTROLLER_URL": url,
            "BABYSITTER_AGENT__NODE_NAME": node,
            "BABYSITTER_AGENT__TOKEN_FILE": str(secrets.node_token_file(node)),
            "BABYSITTER_AGENT__SPOOL_PATH": str(tmp_path / f"{node}-spool.db"),
            "BABYSITTER_AGENT__INTERVAL_S": str(interval),
            "BABYSITTER_AGENT__REQUEST_TIMEOUT_S": "1",
            "BABYSITTER_AGENT__ENABLED_CHECKS": '["host.resources"]',
            "BABYSITTER_CHECKS__HOST__CHECK_SLURMD": "false",
            "BABYSITTER_CHECKS__HOST__MIN_FREE_GB": "0",
        }
    )
    return env


def start_agent(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "babysitter.cli.main", "agent"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def spooled_ids(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        try:
            return [r[0] for r in db.execute("SELECT report_id FROM spool ORDER BY seq")]
        except sqlite3.OperationalError:  # the agent has created the file, not yet the table
            return []


def test_spool_is_bounded_and_drops_oldest_first(tmp_path):
    s = Spool(tmp_path / "s.db", max_reports=10)
    for i in range(25):
        s.put({"report_id": f"r{i:02d}", "n": i})
    assert s.size() == 10
    assert s.counter("dropped") == 15
    assert [r["report_id"] for _, r in s.peek(100)] == [f"r{i:02d}" for i in range(15, 25)]


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
def test_agent_spools_while_controller_is_down_and_replays_in_order(secrets, tmp_path, db, request):
    db_url = (
        f"sqlite:///{tmp_path / 'c.db'}" if db == "sqlite" else request.getfixturevalue("pg_url")
    )
    port = free_port()
    cfg = controller_config(secrets, db_url, port=port)
    env = agent_env(secrets, tmp_path, f"http://127.0.0.1:{port}")
    agent = start_agent(env)
    ctl = ControllerProcess(cfg, log=tmp_path / "ctl.log")
    try:
        spool = tmp_path / "node1-spool.db"
        wait_for(lambda: spool.exists() and len(spooled_ids(spool)) >= 5, 40, "5 spooled")
        ids = spooled_ids(spool)
        ctl.start()
        wait_for(lambda: not spooled_ids(spool), 40, "spool replayed")
        store = Store(db_url)
        stored = store.report_ids()
        assert set(ids) <= set(stored)
        assert len(stored) == len(set(stored))
        # replayed in the order they were spooled
        with store.engine.connect() as c:
            from sqlalchemy import text

            order = [r[0] for r in c.execute(text("SELECT report_id FROM reports ORDER BY id"))]
        positions = [order.index(i) for i in ids]
        assert positions == sorted(positions)
        store.close()
    finally:
        agent.terminate()
        agent.wait(timeout=20)
        ctl.stop()


@pytest.mark.reliability
def test_kill9_of_the_controller_loses_no_acknowledged_report(secrets, tmp_path):
    db_url = f"sqlite:///{tmp_path / 'c.db'}"
    port = free_port()
    cfg = controller_config(secrets, db_url, port=port)
    ctl = ControllerProcess(cfg, log=tmp_path / "ctl.log").start()
    acked: list[str] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=2, headers=secrets.headers("node1")) as c:
            while not stop.is_set():
                rid = str(uuid.uuid4())
                body = {
                    "node": "node1",
                    "report_id": rid,
                    "sent_at": datetime.now(UTC).isoformat(),
                    "findings": [],
                    "metrics": {},
                }
                try:
                    r = c.post(f"{ctl.url}/api/v1/reports", json=body)
                except httpx.HTTPError:
                    time.sleep(0.05)
                    continue
                if r.status_code in (200, 202):
                    acked.append(rid)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(acked) > 200, 60, "200 acknowledged reports")
        ctl.kill9()
        n_before_restart = len(acked)
        ctl.start()
        wait_for(lambda: len(acked) > n_before_restart + 50, 60, "more reports after restart")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
        ctl.stop()
    store = Store(db_url)
    stored = store.report_ids()
    store.close()
    print(
        f"\nkill -9 under load: acknowledged {len(acked)}, stored {len(stored)}, lost "
        f"{len(set(acked) - set(stored))}, duplicates {len(stored) - len(set(stored))}"
    )
    assert set(acked) <= set(stored), f"{len(set(acked) - set(stored))} acknowledged reports lost"
    assert len(stored) == len(set(stored))


def test_agent_tells_systemd_ready_and_watchdog(secrets, tmp_path):
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(30)
    env = agent_env(secrets, tmp_path, "http://127.0.0.1:9")  # no controller: must not matter
    env["NOTIFY_SOCKET"] = str(sock_path)
    env["WATCHDOG_USEC"] = "2000000"
    agent = start_agent(env)
    try:
        got: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            any("READY=1" in g for g in got) and any("WATCHDOG=1" in g for g in got)
        ):
            got.append(sock.recv(4096).decode())
    finally:
        agent.terminate()
        agent.wait(timeout=20)
        sock.close()
    assert any("READY=1" in g for g in got), got
    assert any("WATCHDOG=1" in g for g in got), got


def test_agent_metrics_port_serves_health_gauges(secrets, tmp_path):
    port = free_port()
    env = agent_env(secrets, tmp_path, "http://127.0.0.1:9")
    env["BABYSITTER_AGENT__METRICS_LISTEN"] = f"127.0.0.1:{port}"
    agent = start_agent(env)
    try:

        def scraped() -> str:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                return ""

        wait_for(lambda: "babysitter_agent_component_health{" in scraped(), 30, "metrics")
        text = scraped()
    finally:
        agent.terminate()
        agent.wait(timeout=20)
    assert 'babysitter_agent_component_health{check="host.resources",component="host"} 0.0' in text
    assert 'babysitter_agent_check_duration_seconds{check="host.resources"}' in text
    r = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_two_checks_ending_together_never_leave_the_older_snapshot_as_the_node_state(
    secrets, tmp_path
):
    """The controller keeps the full report with the latest sent_at as the node's state. When
    two check threads finish together (GPU lost: presence goes critical while another check
    warns), the report sent last must be the one that holds both: a stale one sent last once
    hid a lost GPU from the controller for 23 s."""
    from babysitter.agent.daemon import Agent
    from babysitter.checks.base import CheckResult
    from babysitter.finding import Finding, Severity

    cfg = offline_agent_config(secrets, tmp_path)
    agent = Agent(cfg)
    sent: list[dict] = []
    agent.shipper.submit = sent.append  # type: ignore[method-assign]

    def finding(check: str, sev: Severity) -> Finding:
        return Finding(check=check, component="gpu5", severity=sev, code=f"{check}.x", message=".")

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name

    # the warning's report is slow to build (metrics, spool size) while the critical one lands
    a_done = threading.Event()
    snapshot_taken = threading.Event()
    real_report = agent._report

    def slow_report(findings, kind):
        if not any(f.severity is Severity.CRITICAL for f in findings):
            snapshot_taken.set()
            # with the report lock held the critical report cannot land meanwhile: bounded wait
            a_done.wait(0.5)
        return real_report(findings, kind)

    agent._report = slow_report  # type: ignore[method-assign]
    warn = threading.Thread(
        target=agent._store,
        args=(
            Named("gpu.thermal"),
            CheckResult("gpu.thermal", [finding("gpu.thermal", Severity.WARNING)], 0.0),
        ),
    )
    warn.start()
    assert snapshot_taken.wait(10)  # the warning's report has taken its snapshot
    agent._store(
        Named("gpu.presence"),  # type: ignore[arg-type]
        CheckResult("gpu.presence", [finding("gpu.presence", Severity.CRITICAL)], 0.0),
    )
    a_done.set()
    warn.join(5)
    assert len(sent) == 2
    last = max(sent, key=lambda r: r["sent_at"])
    assert {f["severity"] for f in last["findings"]} >= {"critical", "warning"}, last["findings"]


def test_an_event_source_that_cannot_start_is_a_degraded_agent_in_every_report(secrets, tmp_path):
    """The source's state is reported like a check's: a degradation ships at once and stays in
    every full report until the source runs; then it is gone (not kept like an event)."""
    from babysitter.agent.daemon import Agent
    from babysitter.checks.base import EventSource
    from babysitter.finding import Finding, Severity

    agent = Agent(offline_agent_config(secrets, tmp_path))
    sent: list[dict] = []
    agent.shipper.submit = sent.append  # type: ignore[method-assign]

    def state(sev: Severity, code: str) -> list[Finding]:
        return [
            Finding(check="nvml.events", component="host", severity=sev, code=code, message=".")
        ]

    class CannotStart(EventSource):
        name = "nvml.events"

        def start(self, emit):
            self.set_health(state(Severity.WARNING, "agent.degraded"))

    src = CannotStart(agent.ctx)
    agent._sources = [src]
    agent.start_sources()
    assert [f["code"] for f in sent[-1]["findings"]] == ["agent.degraded"]  # shipped at once
    assert "agent.degraded" in [f["code"] for f in agent.full_report()["findings"]]
    src.set_health(state(Severity.OK, "events.running"))
    assert [f["code"] for f in agent.full_report()["findings"]] == ["events.running"]


def test_a_critical_signal_that_clears_is_reported_at_once(secrets, tmp_path):
    """An IB port back up is shipped now, not at the next report: the controller holds a
    babysat job's requeue on a link fault only for the grace, and must know the link is back
    by then. A warning that clears waits for the next report as before."""
    from babysitter.agent.daemon import Agent
    from babysitter.checks.base import CheckResult
    from babysitter.finding import Finding, Severity

    agent = Agent(offline_agent_config(secrets, tmp_path))
    sent: list[dict] = []
    agent.shipper.submit = sent.append  # type: ignore[method-assign]

    class Named:
        name = "ib.ports"

    def store(*findings: Finding) -> None:
        agent._store(Named(), CheckResult("ib.ports", list(findings), 0.0))  # type: ignore[arg-type]

    def port(sev: Severity, code: str) -> Finding:
        return Finding(
            check="ib.ports", component="ib:mlx5_0/1", severity=sev, code=code, message=code
        )

    store(port(Severity.CRITICAL, "ib.port_down"))
    assert len(sent) == 1  # worse: at once
    store(port(Severity.OK, "ib.ok"))
    assert len(sent) == 2 and [f["code"] for f in sent[-1]["findings"]] == ["ib.ok"]
    store(port(Severity.WARNING, "ib.symbol_error"))
    assert len(sent) == 3  # worse again
    store(port(Severity.OK, "ib.ok"))
    assert len(sent) == 3  # a warning gone: the next report says so
