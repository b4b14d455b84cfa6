"""The HTTP API (FastAPI). Contract: DESIGN.md."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from babysitter import __version__
from babysitter.controller.auth import NODE_HEADER, Authenticator, Principal
from babysitter.controller.guard_api import add_guard_route
from babysitter.controller.metrics import ControllerMetrics
from babysitter.controller.store import Report, ReportRejected, Store
from babysitter.finding import Finding

NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
REPORTS_PATH = "/api/v1/reports"


# Bounds of one report (the body limit comes from controller.max_body_bytes). A node has a few
# dozen components; these leave room for a big node and stop a bad one from filling the store.
MAX_FINDINGS_PER_REPORT = 1000
MAX_DETAILS_BYTES = 16 * 1024  # per finding, as JSON
MAX_METRICS_BYTES = 64 * 1024
# a 422 names the field and shows at most this much of what was sent
MAX_ECHO_CHARS = 200
MAX_ERRORS = 20
DEFAULT_MAX_BODY = 1 << 20
# bodies of the admin endpoints (drain reason, ...) are tiny
MAX_ADMIN_BODY = 64 * 1024


class ReportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: str = Field(pattern=NODE_NAME)
    report_id: uuidlib.UUID
    sent_at: datetime
    findings: list[Finding] = Field(max_length=MAX_FINDINGS_PER_REPORT)
    metrics: dict[str, Any] = Field(default_factory=dict)
    kind: Literal["full", "event"] = "full"


class DrainIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=200)


class Accepted(BaseModel):
    report_id: str
    stored: bool


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, or None."""
    token = header[7:].strip()
    return token if header[:7].lower() == "bearer " and token else None


def _bearer(request: Request) -> str:
    """The bearer token, or 401."""
    token = bearer_token(request.headers.get("authorization", ""))
    if token is None:
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    return token


class StoreUnavailable(Exception):
    pass


class Refused(Exception):
    """A request answered with an error before or instead of storing it."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _suspect(raw: bytes) -> bool:
    """Only these spellings can carry a value the databases refuse: NUL only as the \\u0000
    escape (a raw control character is not JSON), non-finite numbers as NaN/Infinity. Clean
    bodies (all of them, normally) skip the walk; `in` is a memchr scan, a regex with these
    alternatives cost as much as parsing the report. (A number past float range, 1e400, is
    refused by the store's JSON encoder: a 422 as well.)"""
    return b"\\u0000" in raw or b"NaN" in raw or b"Infinity" in raw


def _unstorable(value: Any, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], str] | None:
    """Where `value` holds something neither SQLite's nor Postgres's JSON/text columns keep
    faithfully: NUL, NaN or +-Infinity."""
    if isinstance(value, str):
        return (loc, "NUL characters are not accepted") if "\x00" in value else None
    if isinstance(value, float):
        return None if math.isfinite(value) else (loc, "NaN/Infinity are not accepted")
    if isinstance(value, dict):
        for k, v in value.items():
            if "\x00" in k:
                return ((*loc, k[:40]), "NUL characters are not accepted")
            bad = _unstorable(v, (*loc, k))
            if bad:
                return bad
    elif isinstance(value, list):
        for i, v in enumerate(value):
            bad = _unstorable(v, (*loc, i))
            if bad:
                return bad
    return None


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str))


def report_problems(raw: bytes, body: ReportIn) -> list[dict[str, Any]]:
    """What a well-typed report still may not carry (-> 422), in FastAPI's error shape."""
    errors: list[dict[str, Any]] = []
    if _suspect(raw):
        for k, f in enumerate(body.findings):
            bad = _unstorable(f.message, ("findings", k, "message")) or _unstorable(
                f.details, ("findings", k, "details")
            )
            if bad:
                errors.append(_error(bad[0], bad[1]))
                break
        bad = _unstorable(body.metrics, ("metrics",))
        if bad:
            errors.append(_error(bad[0], bad[1]))
    if len(raw) > MAX_DETAILS_BYTES:  # else no finding's details can be that big
        for k, f in enumerate(body.findings):
            if f.details and _json_size(f.details) > MAX_DETAILS_BYTES:
                errors.append(
                    _error(("findings", k, "details"), f"larger than {MAX_DETAILS_BYTES} bytes")
                )
                break
    if len(raw) > MAX_METRICS_BYTES and _json_size(body.metrics) > MAX_METRICS_BYTES:
        errors.append(_error(("metrics",), f"larger than {MAX_METRICS_BYTES} bytes"))
    return errors


def _error(loc: tuple[Any, ...], msg: str) -> dict[str, Any]:
    return {"type": "value_error", "loc": ("body", *loc), "msg": msg, "input": None}


class Ingest:
    """Accepting one report: who sends it (from its headers, before the body is read), how
    much body is read, whether the body may be stored, and handing it to the batching writer.
    Shared by the FastAPI route (every case) and the ASGI fast path (the well-formed,
    authorised case), so both answer alike."""

    def __init__(
        self,
        store: Store,
        auth: Authenticator,
        metrics: ControllerMetrics,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.store = store
        self.auth = auth
        self.metrics = metrics
        self.max_body = max_body
        self._new = metrics.reports.labels("new")
        self._duplicate = metrics.reports.labels("duplicate")

    def sender(
        self, authorization: str | None, node: str | None, content_length: str | None
    ) -> Principal:
        """Check a report's headers; raises Refused (401/403/413) without touching the body."""
        token = bearer_token(authorization or "")
        if token is None:
            raise Refused(401, "missing bearer token")
        p = self.auth.sender(token, node)
        if p is None:
            raise Refused(
                403,
                f"token not valid for node {node[:64]}"
                if node
                else f"token not valid (a node names itself in {NODE_HEADER})",
            )
        if p.role == "read":
            raise Refused(403, "read token cannot report")
        if content_length is not None:
            try:
                declared = int(content_length)
            except ValueError:
                raise Refused(400, "bad content-length") from None
            if declared > self.max_body:
                raise Refused(413, self.too_large)
        return p

    @property
    def too_large(self) -> str:
        return f"report body larger than {self.max_body} bytes"

    def refusal(self, sender: Principal, body: ReportIn) -> str | None:
        """Why this sender may not send this report (-> 403), or None."""
        if sender.role == "node" and sender.node != body.node:
            # a valid token of another node: refused for this node
            return f"token not valid for node {body.node}"
        return None

    async def accept(self, body: ReportIn) -> tuple[int, bytes]:
        """Store the report; (202, body) when new, (200, body) for a duplicate, after commit.
        Raises Refused(422) when the database refuses this report alone."""
        start = time.perf_counter()
        report_id = str(body.report_id)
        fut = self.store.submit_async(
            Report(
                node=body.node,
                report_id=report_id,
                sent_at=body.sent_at,
                findings=body.findings,
                metrics=body.metrics,
                kind=body.kind,
            )
        )
        try:
            async with asyncio.timeout(30):
                new = await fut
        except ReportRejected as exc:
            raise Refused(422, [_error((), f"the database refused it: {exc}"[:300])]) from None
        except Exception as exc:
            raise StoreUnavailable(f"store unavailable: {exc!r}") from None
        self.metrics.ingest_latency.observe(time.perf_counter() - start)
        (self._new if new else self._duplicate).inc()
        if new:
            self.auth.learn((body.node,))
            if body.metrics.get("spool_replayed"):
                self.metrics.spool_replayed.inc()
        payload = b'{"report_id":"%s","stored":%s}' % (
            report_id.encode(),
            b"true" if new else b"false",
        )
        return (202 if new else 200), payload


def _clip(value: Any) -> Any:
    """What a 422 may show of an input: short scalars as they are, anything else summarised
    (a 300 MB array must not come back in the answer)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # not JSON: the answer could not be encoded
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_ECHO_CHARS else value[:MAX_ECHO_CHARS] + "..."
    if isinstance(value, bytes | bytearray):
        return {}  # not JSON at all, maybe not even UTF-8: not echoed (FastAPI does the same)
    try:
        text = json.dumps(value, default=str, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return value if len(text) <= MAX_ECHO_CHARS else f"<{type(value).__name__}, not shown>"


def _body_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """The 422 shape FastAPI gives for a declared body, bounded (see bounded_errors)."""
    return bounded_errors(
        [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)[:MAX_ERRORS]]
    )


def bounded_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Validation errors as a 422 shows them: at most MAX_ERRORS, and of what was sent (input,
    keys in the location, context) at most about MAX_ECHO_CHARS in all; the rest of the
    inputs is left out. A 300 MB array or a 100 kB key must not come back in the answer."""
    out: list[dict[str, Any]] = []
    budget = MAX_ECHO_CHARS * 2
    for e in list(errors)[:MAX_ERRORS]:
        err: dict[str, Any] = {k: v for k, v in dict(e).items() if k != "url"}
        err["loc"] = [x[:64] if isinstance(x, str) else x for x in err.get("loc", ())]
        shown = _clip(err.get("input")) if budget > 0 else None
        budget -= len(json.dumps(shown, default=str))
        err["input"] = shown
        if "ctx" in err:
            err["ctx"] = {str(k)[:64]: _clip(str(v))[:100] for k, v in err["ctx"].items()}
        out.append(err)
    return out


def _handled_by(handler: Callable[[Request], Awaitable[Response]]) -> type[APIRoute]:
    """A route class that keeps FastAPI's declaration of an endpoint (OpenAPI, 422 and error
    handlers, middleware) but serves requests with `handler` directly: no dependency solving
    and no json.loads + dict walk before validation. Used for the ingest hot path only."""

    class HandledRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            return handler  # type: ignore[return-value]

    return HandledRoute


def create_app(
    store: Store,
    auth: Authenticator,
    metrics: ControllerMetrics,
    state: dict[str, Any] | None = None,
    max_body: int = DEFAULT_MAX_BODY,
) -> FastAPI:
    app = FastAPI(title="babysitter controller", version=__version__)
    runtime_state = state if state is not None else {}

    def reader(request: Request) -> Principal:
        p = auth.identify(_bearer(request))
        if p is None or p.role not in ("admin", "read"):
            raise HTTPException(403, "admin or read token required")
        return p

    def admin(request: Request) -> Principal:
        p = auth.identify(_bearer(request))
        if p is None or p.role != "admin":
            raise HTTPException(403, "admin token required")
        return p

    ingest = app.state.ingest = Ingest(store, auth, metrics, max_body)
    app.add_middleware(AdminBodyGuard, auth=auth)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes every input whole
        return JSONResponse(
            {"detail": jsonable_encoder(bounded_errors(exc.errors()))}, status_code=422
        )

    async def handle_report(request: Request) -> Response:
        """POST /api/v1/reports, every case. Runs as the route's whole handler (see
        _handled_by): the headers first (token, node, declared length: 401/403/413 without
        reading the body), then the body read up to the limit (413 past it, also when
        streamed), validated by pydantic-core in one step, then the batching writer; 202 only
        after the report's transaction has committed. In the server, well-formed authorised
        reports take the ASGI fast path (fastpath.IngestFastPath) and everything else lands
        here."""
        try:
            sender = ingest.sender(
                request.headers.get("authorization"),
                request.headers.get(NODE_HEADER),
                request.headers.get("content-length"),
            )
            raw = bytearray()
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > ingest.max_body:
                    raise Refused(413, ingest.too_large)
            try:
                body = ReportIn.model_validate_json(raw)
            except ValidationError as exc:
                raise Refused(422, _body_errors(exc)) from None
            problems = report_problems(bytes(raw), body)
            if problems:
                raise Refused(422, problems)
            refusal = ingest.refusal(sender, body)
            if refusal is not None:
                raise Refused(403, refusal)
            status, payload = await ingest.accept(body)
        except Refused as exc:
            return refused(exc)
        except StoreUnavailable as exc:
            raise HTTPException(503, str(exc)) from None
        return Response(payload, status_code=status, media_type="application/json")

    async def post_report(body: ReportIn) -> Accepted:
        """Declares the route for OpenAPI; requests are served by `handle_report`."""
        raise NotImplementedError  # pragma: no cover

    app.router.add_api_route(
        "/api/v1/reports",
        post_report,
        methods=["POST"],
        status_code=202,
        response_model=Accepted,
        responses={
            200: {"model": Accepted, "description": "duplicate, stored before"},
            401: {"description": "no bearer token"},
            403: {"description": "token not valid for this node"},
            413: {"description": "body larger than controller.max_body_bytes"},
            503: {"description": "store unavailable"},
        },
        route_class_override=_handled_by(handle_report),
    )

    @app.get("/api/v1/nodes")
    def list_nodes(_: Principal = Depends(reader)) -> list[dict[str, Any]]:
        return [node_view(n, runtime_state) for n in store.node_rows()]

    @app.get("/api/v1/nodes/{name}")
    def get_node(name: str, _: Principal = Depends(reader)) -> dict[str, Any]:
        n = store.node(name)
        if n is None:
            raise HTTPException(404, f"unknown node {name}")
        return node_view(n, runtime_state)

    @app.get("/api/v1/findings")
    def list_findings(
        node: str | None = None,
        since: datetime | None = None,
        severity: Literal["ok", "info", "warning", "critical"] | None = None,
        limit: int = Query(1000, ge=1, le=10_000),
        _: Principal = Depends(reader),
    ) -> list[dict[str, Any]]:
        return store.findings(node=node, since=since, severity=severity, limit=limit)

    @app.get("/api/v1/jobs")
    def list_jobs(_: Principal = Depends(reader)) -> list[dict[str, Any]]:
        return store.jobs()

    @app.get("/api/v1/actions")
    def list_actions(
        status: str | None = None, _: Principal = Depends(reader)
    ) -> list[dict[str, Any]]:
        return store.actions(status=status)

    @app.post("/api/v1/nodes/{name}/drain", status_code=202)
    def drain(
        body: DrainIn, name: str = Path(pattern=NODE_NAME), p: Principal = Depends(admin)
    ) -> dict[str, Any]:
        aid = store.record_action(
            "drain", node=name, reason=body.reason, rule="manual", requested_by="admin"
        )
        return {"action_id": aid, "status": "pending"}

    @app.post("/api/v1/nodes/{name}/resume", status_code=202)
    def resume(
        name: str = Path(pattern=NODE_NAME), p: Principal = Depends(admin)
    ) -> dict[str, Any]:
        aid = store.record_action("resume", node=name, rule="manual", requested_by="admin")
        return {"action_id": aid, "status": "pending"}

    @app.post("/api/v1/jobs/{job_id}/requeue", status_code=202)
    def requeue(
        job_id: int = Path(gt=0, lt=2**53), p: Principal = Depends(admin)
    ) -> dict[str, Any]:
        aid = store.record_action("requeue", job_id=job_id, rule="manual", requested_by="admin")
        return {"action_id": aid, "status": "pending"}

    @app.post("/api/v1/guard/reset", status_code=202)
    def guard_reset(p: Principal = Depends(admin)) -> dict[str, Any]:
        aid = store.record_action("guard_reset", rule="manual", requested_by="admin")
        return {"action_id": aid, "status": "pending"}

    add_guard_route(app, store, reader)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/readyz")
    def readyz() -> Response:
        ok = store.ping()
        body = {
            "database": "ok" if ok else "unreachable",
            # leader: this controller holds the lock AND runs the remediation loop
            "leader": bool(runtime_state.get("leader", False)),
            "remediation": bool(runtime_state.get("remediation", False)),
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    def prom() -> Response:
        verdicts: dict[str, int] = {"healthy": 0, "suspect": 0, "unhealthy": 0, "unknown": 0}
        try:
            for n in store.node_rows():
                v = node_view(n, runtime_state)["verdict"]
                verdicts[v] = verdicts.get(v, 0) + 1
        except Exception:
            pass
        for v, c in verdicts.items():
            metrics.nodes.labels(v).set(c)
        metrics.is_leader.set(1 if runtime_state.get("leader") else 0)
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def refused(exc: Refused) -> Response:
    """The answer to a refused report: FastAPI's {"detail": ...} shape. A refusal before the
    whole body was read closes the connection (the rest of the body is never read)."""
    headers = {"connection": "close"} if exc.status in (401, 403, 413) else {}
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(
        jsonable_encoder({"detail": exc.detail}), status_code=exc.status, headers=headers
    )


class AdminBodyGuard:
    """Every request with a body except reports is an admin action: check the admin token
    and the body size before FastAPI reads the body (it parses bodies before it runs the
    endpoint's auth dependency)."""

    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] in ("GET", "HEAD", "OPTIONS")
            or scope["path"] == REPORTS_PATH
        ):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        token = bearer_token(headers.get("authorization", ""))
        p = None if token is None else self.auth.identify(token)
        exc = None
        if token is None:
            exc = Refused(401, "missing bearer token")
        elif p is None or p.role != "admin":
            exc = Refused(403, "admin token required")
        elif not headers.get("content-length", "0").isdigit():
            exc = Refused(400, "bad content-length")
        elif int(headers.get("content-length", "0")) > MAX_ADMIN_BODY:
            exc = Refused(413, f"body larger than {MAX_ADMIN_BODY} bytes")
        if exc is not None:
            await refused(exc)(scope, receive, send)
            return
        await self.app(scope, _bounded(receive, MAX_ADMIN_BODY), send)


def _bounded(receive: Receive, limit: int) -> Receive:
    """A receive channel that stops a chunked body past `limit` (reported as a disconnect:
    FastAPI answers 400 and the rest is never read)."""
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        msg = await receive()
        if msg["type"] == "http.request":
            seen += len(msg.get("body", b""))
            if seen > limit:
                return {"type": "http.disconnect"}
        return msg

    return bounded


def node_view(n: dict[str, Any], runtime_state: dict[str, Any]) -> dict[str, Any]:
    """What the API shows for a node; the verdict falls back to a heartbeat-aware one until
    the policy loop has written its own."""
    from babysitter.controller.store import now

    timeout = float(runtime_state.get("heartbeat_timeout_s", 120))
    last = n.get("last_report_at")
    stale = last is None or (now() - last).total_seconds() > timeout
    worst = n.get("worst_severity", "ok")
    if stale:
        verdict = "unknown"
    elif worst == "critical":
        verdict = "unhealthy"
    elif worst == "warning":
        verdict = "suspect"
    else:
        verdict = "healthy"
    policy_verdict = n.get("verdict")
    if policy_verdict and policy_verdict != "unknown" and not stale:
        verdict = policy_verdict
    return {
        "name": n["name"],
        "verdict": verdict,
        "last_report_at": last,
        "heartbeat_age_s": None if last is None else round((now() - last).total_seconds(), 1),
        "open_findings": n.get("open_findings") or [],
        "worst_severity": worst,
        "consecutive_clean": n.get("consecutive_clean", 0),
        "babysitter_drained": bool(n.get("babysitter_drained")),
        "drain_reason": n.get("drain_reason"),
        "slurm_state": n.get("slurm_state"),
        "slurm_reason": n.get("slurm_reason"),
    }
