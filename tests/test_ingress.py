"""Hostile input at the controller's door (issue 14): the sender is checked before the body is
read, bodies are bounded, values the databases cannot keep are a 422 on both, one bad report
cannot fail others, node state only moves forward, and open findings stay bounded."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from babysitter.controller.api.ingest import ReportRejected, ReportWriter
from babysitter.controller.db.store import Store
from babysitter.finding import Finding, Severity
from babysitter.report import Report
from babysitter.slurm.base import validate_node
from babysitter.slurm.client import SlurmRejected
from tests.fixtures.controller import ControllerProcess, Secrets, controller_config, free_port
from tests.fixtures.reports import wire_report

MB = 1 << 20


def finding(code: str = "x.y", severity: str = "warning", **extra: Any) -> dict:
    return {
        "check": "gpu.memory",
        "component": "gpu0",
        "severity": severity,
        "code": code,
        "message": "m",
        **extra,
    }


# ---- values the databases cannot keep, bounds of one report (SQLite and Postgres)


@pytest.mark.parametrize(
    "raw",
    [
        '{"message_nul": "a\\u0000b"}',
        '{"x": NaN}',
        '{"x": Infinity}',
        '{"x": -Infinity}',
        '{"x": 1e400}',
        '{"x": "\\ud800"}',
        '{"a\\u0000": 1}',
    ],
)
def test_values_no_database_keeps_are_422(client, secrets, ctl, raw):
    body = json.dumps(wire_report("node1", [finding()]))
    for where in ('"metrics": {}', '"findings": [{'):
        if where == '"metrics": {}':
            text = body.replace(where, f'"metrics": {raw}')
        else:
            text = body.replace('"message": "m"', f'"message": "m", "details": {raw}')
        r = client.post("/api/v1/reports", content=text, headers=secrets.headers("node1"))
        assert r.status_code == 422, (text, r.text)
        # the answer names the field that holds the value (docs/architecture.md); a lone
        # surrogate is not JSON at all, refused where the parser stopped
        part = "metrics" if where == '"metrics": {}' else "findings"
        loc = r.json()["detail"][0]["loc"]
        assert loc == ["body"] if "ud800" in raw else loc[:2] == ["body", part], r.text
    nul = body.replace('"message": "m"', '"message": "a\\u0000b"')
    r = client.post("/api/v1/reports", content=nul, headers=secrets.headers("node1"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "message"
    # the well-formed report still goes through
    ok = client.post("/api/v1/reports", content=body, headers=secrets.headers("node1"))
    assert ok.status_code == 202
    assert ctl.store.count("reports") == 1


@pytest.mark.parametrize("name", ["ALL", "all", "Default", "NONE"])
def test_a_node_named_like_a_slurm_keyword_is_refused(client, secrets, ctl, name):
    """`ALL` matches the node-name pattern, yet Slurm reads it as every node (`Nodes=ALL`):
    a report for it, even with that name's valid token, is a 422 naming the node, and
    nothing is stored or shown; babysitter never hands such a name to Slurm either."""
    r = client.post("/api/v1/reports", json=wire_report(name), headers=secrets.headers(name))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "node"] and "keyword" in r.text
    assert ctl.store.count("reports") == 0 and ctl.store.node_rows() == []
    with pytest.raises(SlurmRejected):
        validate_node(name)
    ok = client.post(
        "/api/v1/reports", json=wire_report("allnode1"), headers=secrets.headers("allnode1")
    )
    assert ok.status_code == 202


def test_report_bounds(client, secrets):
    h = secrets.headers("node1")
    big_details = wire_report("node1", [finding(details={"blob": "x" * (17 * 1024)})])
    r = client.post("/api/v1/reports", json=big_details, headers=h)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == [
        "body",
        "findings",
        0,
        "details",
    ]
    big_metrics = wire_report("node1", metrics={f"k{i}": "v" * 100 for i in range(700)})
    assert client.post("/api/v1/reports", json=big_metrics, headers=h).status_code == 422
    many = wire_report("node1", [finding(f"c.{i}") for i in range(1001)])
    r = client.post("/api/v1/reports", json=many, headers=h)
    assert r.status_code == 422
    assert len(r.content) < 2000, "a 422 shows little of the input"
    assert client.post("/api/v1/reports", json=wire_report("node1"), headers=h).status_code == 202


def test_a_422_echoes_a_few_hundred_bytes_at_most(client, secrets):
    h = secrets.headers("node1")
    for bad in (
        {**wire_report("node1"), "findings": [{"junk": "y" * 100_000}] * 5},
        {**wire_report("node1"), "node": "z" * 100_000},
        {**wire_report("node1"), "findings": "w" * 500_000},
        {**wire_report("node1"), "metrics": ["v" * 1000] * 300},
        # an unknown key is ignored (a newer agent's field: docs/deploy.md, version skew), a
        # known one with a wrong type is refused
        {**wire_report("node1"), "wire_version": "k" * 100_000},
        float("inf"),  # an input that is not JSON is not echoed either
        [float("nan")],
        {**wire_report("node1"), "findings": [{**finding(), "message": "m" * 100_000}] * 5},
    ):
        r = client.post("/api/v1/reports", content=json.dumps(bad), headers=h)
        assert r.status_code == 422
        assert len(r.content) < 3000, len(r.content)
    # the other endpoints' 422s are bounded the same way
    admin = {"Authorization": f"Bearer {secrets.admin}"}
    r = client.post("/api/v1/nodes/node1/drain", json={"reason": "r" * 60_000}, headers=admin)
    assert r.status_code == 422 and len(r.content) < 3000
    r = client.get("/api/v1/findings", params={"since": "s" * 10_000}, headers=admin)
    assert r.status_code == 422 and len(r.content) < 3000


def test_sender_is_checked_from_the_headers(client, secrets):
    rep = wire_report("node1")
    assert client.post("/api/v1/reports", json=rep).status_code == 401
    wrong = {"Authorization": "Bearer nope", "X-Babysitter-Node": "node1"}
    assert client.post("/api/v1/reports", json=rep, headers=wrong).status_code == 403
    # another node's valid token, naming its own node in the header, for node1's report
    r = client.post("/api/v1/reports", json=rep, headers=secrets.headers("node2"))
    assert r.status_code == 403 and "node1" in r.json()["detail"]
    read = {"Authorization": f"Bearer {secrets.read}"}
    assert client.post("/api/v1/reports", json=rep, headers=read).status_code == 403
    # without the header, a token is recognised only for a node the controller already knows
    bare = {"Authorization": f"Bearer {secrets.node('node1')}"}
    assert client.post("/api/v1/reports", json=rep, headers=bare).status_code == 403
    assert client.post("/api/v1/reports", json=rep, headers=secrets.headers("node1")).status_code
    assert (
        client.post("/api/v1/reports", json=wire_report("node1"), headers=bare).status_code == 202
    )
    # admin actions: auth and size checked before FastAPI reads the body
    drain = "/api/v1/nodes/node1/drain"
    assert client.post(drain, content=b"x" * 100_000).status_code == 401
    admin = {"Authorization": f"Bearer {secrets.admin}"}
    assert client.post(drain, content=b"x" * 100_000, headers=admin).status_code == 413
    assert client.post(drain, json={"reason": "r"}, headers=admin).status_code == 202


# ---- the writer: one bad report does not fail others


def test_a_batch_the_database_refuses_is_retried_report_by_report(pg_url):
    """A value only Postgres refuses (NUL in text), past the API's checks (straight into the
    store): the other reports of the same batch are stored and acknowledged."""
    store = Store(pg_url)
    store.upgrade()
    writer = ReportWriter(store)
    writer.start()

    async def submit() -> list[Any]:
        reports = [
            Report(
                node=f"n{i}",
                report_id=str(uuid.uuid4()),
                sent_at=datetime.now(UTC),
                findings=[],
                metrics={"i": i},
            )
            for i in range(20)
        ]
        bad = Finding(
            check="gpu.memory", component="gpu0", severity=Severity.WARNING, code="x", message="\0"
        )
        reports.insert(
            7,
            Report(
                node="bad",
                report_id=str(uuid.uuid4()),
                sent_at=datetime.now(UTC),
                findings=[bad],
                metrics={},
            ),
        )
        futs = [writer.submit_async(r) for r in reports]
        return await asyncio.gather(*futs, return_exceptions=True)

    try:
        out = asyncio.run(submit())
        assert isinstance(out[7], ReportRejected), out[7]
        assert "NUL" in str(out[7]) and len(str(out[7])) <= 200
        assert out[:7] + out[8:] == [True] * 20
        assert store.count("reports") == 20
        assert writer.split_batches >= 1
    finally:
        writer.close()
        store.close()


def test_postgres_nul_report_is_422_while_other_nodes_get_202(secrets, pg_url, tmp_path):
    ctl = ControllerProcess(
        controller_config(secrets, pg_url, port=free_port()),
        env={"BABYSITTER_SLURM__SLURM_CONF": "/nonexistent"},
        log=tmp_path / "ctl.log",
    ).start()
    statuses: dict[str, list[int]] = {}

    def node(name: str, nul: bool) -> None:
        with httpx.Client(timeout=30, headers=secrets.headers(name)) as c:
            for _ in range(10):
                body = json.dumps(wire_report(name, [finding()]))
                if nul:
                    body = body.replace('"message": "m"', '"message": "m\\u0000"')
                r = c.post(f"{ctl.url}/api/v1/reports", content=body)
                statuses.setdefault(name, []).append(r.status_code)

    try:
        threads = [threading.Thread(target=node, args=(f"n{i}", i == 0)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        ctl.stop()
    assert statuses.pop("n0") == [422] * 10
    assert all(s == [202] * 10 for s in statuses.values()), statuses


# ---- node state moves forward only; open findings bounded


def test_old_reports_are_history_and_do_not_move_node_state(db_url):
    store = Store(db_url)
    store.upgrade()
    t0 = datetime.now(UTC) - timedelta(minutes=10)
    crit = Finding(
        check="gpu.memory", component="gpu0", severity=Severity.CRITICAL, code="x", message="m"
    )

    def rep(at: datetime, findings: list[Finding]) -> Report:
        return Report(
            node="n1", report_id=str(uuid.uuid4()), sent_at=at, findings=findings, metrics={}
        )

    try:
        ReportWriter(store).write([rep(t0 + timedelta(minutes=5), [crit])])
        # a spool replay of older clean reports: stored, but not clean reports of this node
        ReportWriter(store).write([rep(t0 + timedelta(minutes=k), []) for k in range(3)])
        node = store.node("n1")
        assert node is not None
        assert node["worst_severity"] == "critical" and node["consecutive_clean"] == 0
        assert store.count("reports") == 4
        ReportWriter(store).write([rep(t0 + timedelta(minutes=6), [])])
        ReportWriter(store).write(
            [rep(t0 + timedelta(minutes=4), [crit])]
        )  # older: changes nothing
        node = store.node("n1")
        assert node is not None
        assert node["worst_severity"] == "ok" and node["consecutive_clean"] == 1
        # a clock far ahead does not freeze the node: sent_at counts at most as received
        ReportWriter(store).write([rep(datetime.now(UTC) + timedelta(days=365), [crit])])
        ReportWriter(store).write([rep(datetime.now(UTC) + timedelta(seconds=1), [])])
        node = store.node("n1")
        assert node is not None and node["worst_severity"] == "ok"
    finally:
        store.close()


def test_open_findings_fold_past_the_cap(db_url):
    store = Store(db_url)
    store.upgrade()
    writer = ReportWriter(store, max_open_findings=8)
    try:
        for i in range(30):
            sev = Severity.CRITICAL if i == 3 else Severity.WARNING
            f = Finding(check="xid.nvml", component="gpu0", severity=sev, code=f"c{i}", message="m")
            writer.write(
                [
                    Report(
                        node="n1",
                        report_id=str(uuid.uuid4()),
                        sent_at=datetime.now(UTC),
                        findings=[f],
                        metrics={},
                        kind="event",
                    )
                ]
            )
        node = store.node("n1")
        assert node is not None
        assert len(node["open_findings"]) <= 8
        assert node["worst_severity"] == "critical"
        (folded,) = [f for f in node["open_findings"] if f.code == "ingest.findings_folded"]
        kept = len(node["open_findings"]) - 1
        assert folded.details["folded"] == 30 - kept
    finally:
        store.close()


# ---- a real server: the body of a refused sender is never read


class Rss:
    """Samples the resident set size of a process (from /proc) while a request runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.005)

    def __enter__(self) -> Rss:
        self.base = self.now()
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.now())


def post_big(port: int, headers: dict[str, str], total: int, chunked: bool = False) -> tuple:
    """POST `total` bytes of JSON-looking body, reading the answer while sending: (status,
    bytes of body sent before the answer came, answer)."""
    s = socket.create_connection(("127.0.0.1", port))
    lines = [
        "POST /api/v1/reports HTTP/1.1",
        "Host: controller",
        "Content-Type: application/json",
        *(f"{k}: {v}" for k, v in headers.items()),
        "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}",
    ]
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    s.setblocking(False)
    block = b'{"findings": [' + b"1," * (MB // 2 - 8)
    if chunked:
        block = b"%x\r\n%s\r\n" % (len(block), block)
    sent = 0
    answer = b""
    try:
        while b"\r\n\r\n" not in answer:
            r, w, _ = select.select([s], [s] if sent < total else [], [], 30)
            if not r and not w:
                break
            if r:
                data = s.recv(65536)
                if not data:
                    break
                answer += data
            elif w:
                sent += s.send(block)
    except (BrokenPipeError, ConnectionResetError):
        pass
    s.setblocking(True)
    s.settimeout(5)
    try:
        while b"\r\n\r\n" not in answer and (data := s.recv(65536)):
            answer += data
    except (OSError, TimeoutError):
        pass
    s.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    return status, sent, answer


@pytest.fixture
def server(secrets: Secrets, tmp_path: Path) -> Iterator[ControllerProcess]:
    ctl = ControllerProcess(
        controller_config(secrets, f"sqlite:///{tmp_path / 'c.db'}", port=free_port()),
        env={"BABYSITTER_SLURM__SLURM_CONF": "/nonexistent"},
        log=tmp_path / "ctl.log",
    ).start()
    yield ctl
    ctl.stop()


def test_hostile_100mb_bodies_are_refused_unread(server, secrets):
    assert server.proc is not None
    port = int(server.url.rsplit(":", 1)[1])
    total = 100 * MB
    cases = [
        ({"Authorization": "Bearer " + "A" * 64}, False, (401, 403)),
        ({}, False, (401,)),
        ({"Authorization": "Bearer x", "X-Babysitter-Node": "node1"}, True, (403,)),
        (secrets.headers("node1"), False, (413,)),  # declared: refused from the header
        (secrets.headers("node1"), True, (413,)),  # streamed: reading stops past the limit
    ]
    for headers, chunked, expect in cases:
        with Rss(server.proc.pid) as rss:
            status, sent, answer = post_big(port, headers, total, chunked)
        grew = (rss.peak - rss.base) / MB
        print(
            f"\n{headers.keys()} chunked={chunked}: {status}, sent {sent / MB:.1f} MB, "
            f"RSS +{grew:.1f} MB"
        )
        assert status in expect, answer[:300]
        assert sent < total, "answered before the client finished sending"
        assert grew < 20
    # a valid node's 10 MB of details: refused, and the controller still serves
    big = wire_report("node1", [finding(details={"blob": "d" * (10 * MB)})])
    r = httpx.post(
        f"{server.url}/api/v1/reports", json=big, headers=secrets.headers("node1"), timeout=30
    )
    assert r.status_code in (413, 422)
    ok = httpx.post(
        f"{server.url}/api/v1/reports", json=wire_report("node1"), headers=secrets.headers("node1")
    )
    assert ok.status_code == 202
