"""The ingest fast path answers exactly as the FastAPI route does, and hands the app everything
it does not serve itself (errors, streamed bodies, other paths) with the body intact."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from babysitter.controller.api.app import create_app
from babysitter.controller.api.auth import Principal
from babysitter.controller.api.fastpath import IngestFastPath
from babysitter.controller.api.ingress import Ingest, Refused
from tests.fixtures.reports import WARN, wire_report


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """SQLite only: both doors share one ingest, whose database code test_ingress runs on both."""
    return sqlite_url


def test_fast_path_and_route_give_the_same_answers(ctl, secrets):
    fast = TestClient(ctl.app())
    plain = TestClient(create_app(ctl.store, ctl.auth, ctl.metrics, ctl.ingest, ctl.state))
    h = secrets.headers("node1")
    for client in (fast, plain):
        b = wire_report("node1", [WARN])
        first, again = (client.post("/api/v1/reports", json=b, headers=h) for _ in range(2))
        assert (first.status_code, first.json()) == (
            202,
            {"report_id": b["report_id"], "stored": True},
        )
        assert (again.status_code, again.json()) == (
            200,
            {"report_id": b["report_id"], "stored": False},
        )
        assert first.headers["content-type"] == "application/json"
        # every error case is answered by the app's own handlers, through either door
        wrong = client.post("/api/v1/reports", json=wire_report("node2"), headers=h)
        assert wrong.status_code == 403 and "node2" in wrong.json()["detail"]
        bad = client.post("/api/v1/reports", json={**b, "report_id": "x"}, headers=h)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "report_id"]
        for garbage in (b"{not json", b'#\x19A\xff"\xfe4\xc9\xad:q', b'{"node": "\xff"}', b""):
            r = client.post("/api/v1/reports", content=garbage, headers=h)
            assert r.status_code == 422 and r.json()["detail"][0]["loc"][0] == "body"
        assert client.post("/api/v1/reports", json=wire_report("node1")).status_code == 401
    assert ctl.store.count("reports") == 2
    assert ctl.store.count("findings") == 2


def run_asgi(app: Any, messages: list[dict], path: str = "/api/v1/reports") -> list[dict]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(b"authorization", b"Bearer whatever")],
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(m: dict) -> None:
        sent.append(m)

    asyncio.run(app(scope, receive, send))
    return sent


class RecordingApp:
    """Stands in for the FastAPI app: records what it was handed and reads the body through."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.paths: list[str] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        data = b""
        while True:
            m = await receive()
            data += m.get("body", b"")
            if not m.get("more_body"):
                break
        self.bodies.append(data)
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


class StubIngest:
    """Stands in for Ingest where only the fast path's hand-over is under test: a sender that
    is accepted or refused from the headers, and a body limit."""

    def __init__(self, max_body: int = 1 << 20, refuse: bool = False) -> None:
        self.max_body = max_body
        self.refuse = refuse

    def sender(self, *headers: Any) -> Principal:
        if self.refuse:
            raise Refused(403, "no")
        return Principal("admin")

    def refusal(self, sender: Any, body: Any) -> str | None:
        raise AssertionError("not reached for bodies the fast path hands on")


def test_streamed_body_over_the_limit_reaches_the_app_from_where_it_stopped():
    app = RecordingApp()
    fast = IngestFastPath(app, StubIngest(max_body=8))  # type: ignore[arg-type]
    parts = [b'{"node": ', b'"n1", "findings": ', b"[], ", b'"x": 1}']
    msgs = [{"type": "http.request", "body": p, "more_body": i < 3} for i, p in enumerate(parts)]
    sent = run_asgi(fast, msgs)
    assert app.bodies == [b"".join(parts)]
    assert sent[0]["status"] == 299


def test_a_refused_sender_reaches_the_app_with_the_body_unread():
    app = RecordingApp()
    fast = IngestFastPath(app, StubIngest(refuse=True))  # type: ignore[arg-type]
    msgs = [{"type": "http.request", "body": b"x" * 10, "more_body": True} for _ in range(3)]
    read_by_fast_path: list[int] = []

    async def spy(scope: dict, receive: Any, send: Any) -> None:
        read_by_fast_path.append(3 - len(msgs))
        await app(scope, receive, send)

    fast.app = spy
    run_asgi(fast, msgs)
    assert read_by_fast_path == [0]


def test_invalid_body_and_other_paths_are_handed_on_unchanged():
    app = RecordingApp()
    fast = IngestFastPath(app, StubIngest())  # type: ignore[arg-type]
    garbage = b'{"node": "n1", "findings": 3}'
    run_asgi(fast, [{"type": "http.request", "body": garbage, "more_body": False}])
    other = json.dumps({"reason": "x"}).encode()
    run_asgi(
        fast, [{"type": "http.request", "body": other, "more_body": False}], "/api/v1/nodes/a/drain"
    )
    assert app.bodies == [garbage, other]
    assert app.paths == ["/api/v1/reports", "/api/v1/nodes/a/drain"]


def test_garbage_bodies_and_tokens_never_crash_the_ingest(ctl, secrets):
    """Any bytes as body or token, through the fast path and the route: a 2xx/4xx answer,
    never a server error."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    client = TestClient(ctl.app(), raise_server_exceptions=False)
    valid = json.dumps(wire_report("node1", [WARN])).encode()
    tokens = st.sampled_from([secrets.node("node1").encode(), secrets.admin.encode(), b""]) | (
        st.binary(max_size=40)
    )
    bodies = st.binary(max_size=300) | st.builds(
        lambda cut, junk: valid[:cut] + junk, st.integers(0, len(valid)), st.binary(max_size=8)
    )

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(raw=bodies, token=tokens)
    def check(raw: bytes, token: bytes) -> None:
        headers = {
            "Authorization": b"Bearer " + token,
            "Content-Type": "application/json",
            "X-Babysitter-Node": "node1",
        }
        r = client.post("/api/v1/reports", content=raw, headers=headers)
        assert r.status_code < 500, (r.status_code, r.text)

    check()


def test_the_route_refuses_a_sender_without_reading_the_body(ctl, secrets):
    """The FastAPI route on its own (no fast path in front): 401/403 from the headers, and
    413 for a declared length over the limit, with no body message received."""
    app = create_app(
        ctl.store,
        ctl.auth,
        ctl.metrics,
        Ingest(ctl.writer, ctl.auth, ctl.metrics, max_body=4096),
        ctl.state,
    )
    cases = [
        ([], 401),
        ([(b"authorization", b"Bearer nope")], 403),
        ([(b"authorization", b"Bearer nope"), (b"x-babysitter-node", b"node1")], 403),
        (
            [
                (b"authorization", f"Bearer {secrets.node('node1')}".encode()),
                (b"x-babysitter-node", b"node1"),
                (b"content-length", b"100000000"),
            ],
            413,
        ),
    ]
    for headers, status in cases:
        received: list[dict] = []
        sent: list[dict] = []

        async def receive(received: list[dict] = received) -> dict:
            received.append({})
            return {"type": "http.request", "body": b"x" * 65536, "more_body": True}

        async def send(m: dict, sent: list[dict] = sent) -> None:
            sent.append(m)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/api/v1/reports",
            "headers": headers,
            "query_string": b"",
        }
        asyncio.run(app(scope, receive, send))
        assert sent[0]["status"] == status
        assert received == [], "the body was read"
