"""Connections that never finish their headers, and a thousand idle ones: the controller times
them out and makes room, so a real report is still accepted and the loop keeps ticking."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from tests.fixtures.controller import ControllerProcess, Secrets, controller_config, free_port

# what a service gets without LimitNOFILE: the controller must survive it
NOFILE = 1024


@pytest.fixture
def controller(secrets: Secrets, tmp_path) -> Iterator[ControllerProcess]:
    cfg = controller_config(
        secrets,
        f"sqlite:///{tmp_path / 'c.db'}",
        free_port(),
        controller={"header_timeout_s": 3.0, "remediation": False},
    )
    ctl = ControllerProcess(cfg, log=tmp_path / "controller.log")
    ctl.proc = subprocess.Popen(
        [sys.executable, "-m", "babysitter.cli.main", "controller"],
        env=ctl.env,
        stdout=open(tmp_path / "controller.log", "ab"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE)),
    )
    deadline = time.monotonic() + 60
    while True:
        assert ctl.proc.poll() is None, (tmp_path / "controller.log").read_text()
        try:
            if httpx.get(ctl.url + "/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "controller did not become ready"
        time.sleep(0.1)
    yield ctl
    ctl.stop()


def report(node: str) -> dict:
    return {
        "node": node,
        "report_id": str(uuid.uuid4()),
        "sent_at": datetime.now(UTC).isoformat(),
        "findings": [],
        "metrics": {},
    }


def test_a_thousand_idle_connections_never_lock_out_a_report(controller, secrets):
    host, _, port = controller.cfg.controller.listen.rpartition(":")
    idle: list[socket.socket] = []
    try:
        for _ in range(1000):  # no token, headers never finished
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"POST /api/v1/reports HTTP/1.1\r\nHost: x\r\n")
            idle.append(s)
        body = report("node1")
        with httpx.Client(base_url=controller.url, timeout=10) as c:
            r = c.post("/api/v1/reports", json=body, headers=secrets.headers("node1"))
            assert r.status_code == 202 and r.json()["stored"], r.text
            ready = c.get("/readyz").json()
        assert ready["database"] == "ok"
        assert ready["loop_progress_age_s"] is not None and ready["loop_progress_age_s"] < 5
    finally:
        for s in idle:
            s.close()


def test_a_connection_that_never_finishes_its_headers_is_closed(controller):
    host, _, port = controller.cfg.controller.listen.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        started = time.monotonic()
        assert s.recv(1024) == b""  # closed by the controller, not by our timeout
        assert time.monotonic() - started < 8  # header_timeout_s = 3


def test_only_a_tick_that_succeeded_feeds_the_watchdog(secrets, tmp_path):
    """A loop that fails on every tick (database gone, no descriptor left) is not progress:
    the systemd watchdog must stop being fed so the service is restarted."""
    from babysitter.controller.runtime import Controller

    ctl = Controller(
        controller_config(
            secrets, f"sqlite:///{tmp_path / 'w.db'}", controller={"remediation": False}
        )
    )
    ctl.setup()
    try:
        failing = True

        def prune() -> None:
            if failing:
                raise OSError("[Errno 24] Too many open files")

        ctl.add_loop("retention", prune)  # what an ingest-only SQLite controller runs
        ctl.last_progress -= 1000  # the last good tick was long ago
        stale = ctl.last_progress
        assert ctl.tick() is False
        assert ctl.last_progress == stale and not ctl.watchdog_ok(30)
        failing = False
        assert ctl.tick() is True
        assert ctl.watchdog_ok(30)
    finally:
        ctl.close()
