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
        controller={"header_timeout_s": 3.0, "body_timeout_s": 3.0, "remediation": False},
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
        assert ready["loop_progress_age_s"] is not None  # the loop finished a tick
    finally:
        for s in idle:
            s.close()


def test_a_connection_that_never_finishes_its_headers_is_closed(controller):
    host, _, port = controller.cfg.controller.listen.rpartition(":")
    # header_timeout_s = 3; our own timeout (60 s) only bounds the test: it raises, not b""
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        assert s.recv(1024) == b""  # closed by the controller


def test_a_body_that_never_finishes_is_closed(controller, secrets):
    """Headers complete, then a body that stops arriving: the connection is closed after
    body_timeout_s (3 s here), token or not; our own timeout (60 s) only bounds the test."""
    host, _, port = controller.cfg.controller.listen.rpartition(":")
    heads = [
        b"POST /ui/login HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\ntok",
        (
            "POST /api/v1/reports HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {secrets.node('node1')}\r\nX-Babysitter-Node: node1\r\n"
            "Content-Length: 5000\r\n\r\n{"
        ).encode(),
    ]
    for head in heads:
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.sendall(head)
            assert s.recv(1024) == b"", head[:20]  # closed by the controller, no answer


def test_wrong_tokens_at_the_login_form_are_throttled(controller, secrets):
    """300 wrong tokens as fast as the socket allows: the first 5 are checked
    (controller.login_failures), then the client waits (429, Retry-After), each try during
    the wait doubles it (1 s, 2 s, ...: whatever the machine's speed, at most ten more are
    ever checked within the test's time), and during the wait even the right token is not
    checked, so guessing gets nowhere."""
    statuses = []
    with httpx.Client(base_url=controller.url, timeout=30, follow_redirects=False) as c:
        for i in range(300):
            r = c.post("/ui/login", data={"token": f"guess-{i}"})
            statuses.append(r.status_code)
        refused = c.post("/ui/login", data={"token": secrets.read})
    assert statuses[:5] == [403] * 5, statuses[:10]
    assert statuses.count(403) <= 15 and statuses.count(429) >= 285, statuses
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert "babysitter_ui" not in refused.headers.get("set-cookie", "")


def _open(host: str, port: int, head: bytes) -> socket.socket | None:
    """A connection that sent `head` (headers and the start of a body) and then stalls; None
    when the controller refused it (closed or reset)."""
    try:
        s = socket.create_connection((host, port), timeout=10)
    except OSError:
        return None
    try:
        s.sendall(head)
    except OSError:
        s.close()
        return None
    return s


def _more_descriptors(needed: int) -> None:
    """This test process holds the slow clients' sockets: its soft limit goes up to the hard."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


def test_slow_bodies_to_login_and_from_one_node_never_lock_out_the_fleet(controller, secrets):
    """1,000 connections trickling a body to /ui/login (no token needed) and 1,000 trickling
    reports with one node's valid token, all held open: every other node's report is still
    accepted, /healthz answers, and the controller never runs out of descriptors (its limit
    is 1,024 here, as for a service without LimitNOFILE)."""
    host, _, p = controller.cfg.controller.listen.rpartition(":")
    port = int(p)
    _more_descriptors(2 * 1000 + 256)
    login = (
        b"POST /ui/login HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 4000\r\n\r\nto"
    )
    report_head = (
        "POST /api/v1/reports HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {secrets.node('node1')}\r\nX-Babysitter-Node: node1\r\n"
        "Content-Type: application/json\r\nContent-Length: 200000\r\n\r\n{"
    ).encode()
    held: list[socket.socket] = []
    try:
        for head in (login, report_head):
            for _ in range(1000):
                s = _open(host, port, head)
                if s is not None:
                    held.append(s)
        with httpx.Client(base_url=controller.url, timeout=30) as c:
            assert c.get("/healthz").status_code == 200
            for i in range(2, 22):
                node = f"node{i}"
                r = c.post("/api/v1/reports", json=report(node), headers=secrets.headers(node))
                assert r.status_code == 202 and r.json()["stored"], (node, r.status_code, r.text)
            # the node whose token the slow bodies used is refused for now (429), never cut
            # off from the API for good: its budget comes back as its slow bodies time out
            r = c.post("/api/v1/reports", json=report("node1"), headers=secrets.headers("node1"))
            assert r.status_code in (202, 429), r.text
    finally:
        for s in held:
            s.close()
    log = controller.log.read_text() if controller.log else ""
    assert "Too many open files" not in log, log[-3000:]
    assert controller.proc is not None and controller.proc.poll() is None


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


def test_the_controller_takes_the_hard_descriptor_limit_and_keeps_its_cap_below_it():
    """A service started without LimitNOFILE gets 1,024 soft: the controller raises it to the
    hard limit, and its connection cap stays FD_RESERVE below whatever it got."""
    code = (
        "import resource\n"
        "from babysitter.controller.api.connguard import FD_RESERVE, connection_cap, "
        "raise_fd_limit\n"
        "got = raise_fd_limit()\n"
        "print(got, resource.getrlimit(resource.RLIMIT_NOFILE)[0], connection_cap(100000), "
        "FD_RESERVE)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 2048)),
    )
    assert r.returncode == 0, r.stderr
    got, soft, cap, reserve = map(int, r.stdout.split())
    assert got == soft == 2048 and cap == 2048 - reserve
