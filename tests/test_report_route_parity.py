"""The report route has two doors: the ASGI fast path (controller/api/fastpath.py) in front of the
app, and the FastAPI route behind it. Generated requests, good and bad, go through both and
must get the same status, headers and body bytes.

Each door has its own controller on its own database, so a report stored through one is not a
duplicate for the other; both see the same requests in the same order, so their states stay
alike. Nothing is normalised: neither answer carries a timestamp, a request id or anything else
that may differ between two servers."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.types import ASGIApp

from babysitter.config import Config
from babysitter.controller.api.app import REPORTS_PATH
from babysitter.controller.runtime import Controller
from tests.fixtures.controller import Secrets, controller_config, set_up
from tests.fixtures.reports import WARN

MAX_BODY = 96 * 1024  # above the 64 KiB metrics limit, so both limits can be reached

# a few fixed ids, so generated reports repeat one another (200, stored before)
REPORT_IDS = [str(uuid.UUID(int=k + 1, version=4)) for k in range(3)]

Headers = list[tuple[bytes, bytes]]
Answer = tuple[int, Headers, bytes]


@pytest.fixture
def controllers(secrets: Secrets, tmp_path) -> Iterator[tuple[Controller, Controller]]:
    """Two controllers alike, each on its own database: one per door."""

    def cfg(name: str) -> Config:
        url = f"sqlite:///{tmp_path / name}"
        return controller_config(secrets, url, controller={"max_body_bytes": MAX_BODY})

    with set_up(cfg("fast.db")) as fast, set_up(cfg("plain.db")) as plain:
        yield fast, plain


@pytest.fixture
def doors(controllers: tuple[Controller, Controller]) -> tuple[ASGIApp, ASGIApp]:
    """(the served app: fast path in front, the FastAPI app alone)."""
    fast, plain = controllers
    return fast.app(), plain.app().app


def post(app: ASGIApp, headers: Headers, chunks: list[bytes]) -> Answer:
    """One POST to the reports path as a server hands it to the app: header names in lower
    case, repeated headers kept, the body in the given chunks (more than one: streamed)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": REPORTS_PATH,
        "raw_path": REPORTS_PATH.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }
    todo = [
        {"type": "http.request", "body": c, "more_body": k < len(chunks) - 1}
        for k, c in enumerate(chunks or [b""])
    ]
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return todo.pop(0) if todo else {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        out.append(msg)

    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    start = out[0]
    body = b"".join(m.get("body", b"") for m in out[1:])
    return start["status"], sorted(start.get("headers", [])), body


# ---- what is sent


def _finding(kind: str) -> Any:
    if kind == "good":
        return WARN
    if kind == "bad_severity":
        return {**WARN, "severity": "apocalyptic"}
    if kind == "missing_field":
        return {k: v for k, v in WARN.items() if k != "code"}
    if kind == "unknown_key":
        return {**WARN, "colour": "red"}
    if kind == "nul":
        return {**WARN, "message": "GPU 2\u0000"}
    if kind == "big_details":
        return {**WARN, "details": {"blob": "x" * (17 * 1024)}}
    return "not a finding"


def _report(node: str, rid: str, findings: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "node": node,
        "report_id": rid,
        "sent_at": "2026-11-22T06:00:05+00:00",
        "findings": [_finding(f) for f in findings],
        "metrics": {},
        **extra,
    }


EXTRAS = st.sampled_from(
    [
        {},
        {"kind": "event"},
        {"kind": "sideways"},
        {"colour": "red"},  # unknown keys are refused
        {"metrics": {"gflops": 1.5}},
        {"metrics": {"big": "x" * (65 * 1024)}},
        {"report_id": "not-a-uuid"},
        {"sent_at": "yesterday"},
        {"findings": "none"},
    ]
)
GOOD_EXTRAS = st.sampled_from([{}, {"kind": "event"}, {"metrics": {"gflops": 1.5}}])
FINDINGS = st.lists(
    st.sampled_from(
        ["good", "good", "bad_severity", "missing_field", "unknown_key", "nul", "big_details", "x"]
    ),
    max_size=3,
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    rid = draw(st.sampled_from(REPORT_IDS) | st.uuids(version=4).map(str))
    if draw(st.booleans()):  # an agent's report, new or repeated
        findings = draw(st.lists(st.just("good"), max_size=2))
        raw = json.dumps(_report("node1", rid, findings, draw(GOOD_EXTRAS))).encode()
    else:
        node = draw(st.sampled_from(["node1", "node1", "node2", "-bad name-"]))
        raw = json.dumps(_report(node, rid, draw(FINDINGS), draw(EXTRAS))).encode()
    how = draw(st.sampled_from(["as is"] * 4 + ["cut", "junk", "nan", "huge", "oversize", "empty"]))
    if how == "cut":  # malformed JSON
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if how == "junk":
        return draw(st.binary(max_size=40))
    if how == "nan":  # not JSON, though Python writes it
        return raw.replace(b'"metrics": {}', b'"metrics": {"x": NaN}')
    if how == "huge":  # valid JSON, past float range: no database stores it
        return raw.replace(b'"metrics": {}', b'"metrics": {"x": 1e400}')
    if how == "oversize":
        return raw.replace(b'"metrics": {}', b'"metrics": {"pad": "%s"}' % (b"p" * MAX_BODY))
    if how == "empty":
        return b""
    return raw


@st.composite
def requests(draw: st.DrawFn, secrets: Secrets) -> tuple[Headers, list[bytes]]:
    body = draw(bodies())
    tokens = {
        "node1": secrets.node("node1"),
        "node2": secrets.node("node2"),
        "admin": secrets.admin,
        "read": secrets.read,
        "garbage": "not-a-token",
    }
    headers: Headers = []
    agent = draw(st.booleans())  # an agent's headers: the case the fast path serves itself
    if agent:
        headers += [
            (b"authorization", f"Bearer {tokens['node1']}".encode()),
            (b"x-babysitter-node", b"node1"),
        ]
    # none, one or (beside an agent's own) more of each, in any order (shuffled below)
    for _ in range(draw(st.sampled_from([0, 1] if agent else [1, 1, 1, 0, 2]))):
        scheme = draw(st.sampled_from(["Bearer", "Bearer", "bearer", "Basic"]))
        token = tokens[draw(st.sampled_from(sorted(tokens)))]
        headers.append((b"authorization", f"{scheme} {token}".encode()))
    for _ in range(draw(st.sampled_from([0, 1] if agent else [1, 1, 0, 2]))):
        node = draw(st.sampled_from(["node1", "node2", "", "node1\xff"]))
        headers.append((b"x-babysitter-node", node.encode("latin-1")))
    ctype = draw(
        st.sampled_from(
            [
                "application/json",
                "application/json",
                "application/json; charset=utf-8",
                "text/plain",
                "application/x-www-form-urlencoded",
                None,
            ]
        )
    )
    if ctype is not None:
        headers.append((b"content-type", ctype.encode()))
    streamed = draw(st.booleans())
    if streamed:  # chunked: no content-length, the body in pieces
        size = draw(st.integers(1, 4096))
        chunks = [body[k : k + size] for k in range(0, len(body), size)] or [b""]
    else:
        chunks = [body]
        length = draw(st.sampled_from([str(len(body))] * 5 + ["abc", str(MAX_BODY + 1)]))
        headers.append((b"content-length", length.encode()))
    order = draw(st.permutations(range(len(headers))))
    return [headers[k] for k in order], chunks


def test_fast_path_and_route_answer_every_request_alike(doors, secrets):
    fast, plain = doors

    @settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
    @given(reqs=st.lists(requests(secrets), min_size=1, max_size=3))
    def check(reqs: list[tuple[Headers, list[bytes]]]) -> None:
        for headers, chunks in reqs:
            a = post(fast, headers, chunks)
            b = post(plain, headers, chunks)
            assert a == b, (headers, b"".join(chunks)[:300])

    check()


def test_the_generated_requests_reach_every_answer(doors, secrets):
    """The generator is not stuck in one corner: a fixed sample of its requests gets every
    answer the route documents (stored, duplicate, 400, 401, 403, 413, 422)."""
    fast, _ = doors
    seen: set[int] = set()

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(req=requests(secrets))
    def collect(req: tuple[Headers, list[bytes]]) -> None:
        seen.add(post(fast, *req)[0])

    collect()
    assert seen >= {200, 202, 400, 401, 403, 413, 422}


def test_a_store_outage_is_the_same_503_through_both_doors(controllers, doors, secrets):
    """The database loses a table under a running controller: an agent's report gets the
    same 503 (spool and retry) through either door."""
    for ctl in controllers:
        with ctl.store.engine.begin() as c:
            c.exec_driver_sql("DROP TABLE findings")
    headers = [
        (b"authorization", f"Bearer {secrets.node('node1')}".encode()),
        (b"x-babysitter-node", b"node1"),
        (b"content-type", b"application/json"),
    ]
    body = json.dumps(_report("node1", REPORT_IDS[0], ["good"], {})).encode()
    fast, plain = (post(app, headers, [body]) for app in doors)
    detail = json.loads(fast[2])["detail"]
    assert fast[0] == 503 and "store unavailable" in detail
    # the database's error (table names, SQL, parameters) is the controller's log, not the agent's
    assert "findings" not in detail and "INSERT" not in detail.upper()
    assert fast == plain
