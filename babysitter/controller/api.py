"""The HTTP API (FastAPI). Contract: DESIGN.md."""

from __future__ import annotations

import asyncio
import time
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from babysitter import __version__
from babysitter.controller.auth import Authenticator, Principal
from babysitter.controller.guard_api import add_guard_route
from babysitter.controller.metrics import ControllerMetrics
from babysitter.controller.store import Report, Store
from babysitter.finding import Finding

NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class ReportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: str = Field(pattern=NODE_NAME)
    report_id: uuidlib.UUID
    sent_at: datetime
    findings: list[Finding] = Field(max_length=10_000)
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


class Ingest:
    """Accepting one report: whether its token may send it, and handing it to the batching
    writer. Shared by the FastAPI route (every case) and the ASGI fast path (the well-formed,
    authorised case), so both answer alike."""

    def __init__(self, store: Store, auth: Authenticator, metrics: ControllerMetrics) -> None:
        self.store = store
        self.auth = auth
        self.metrics = metrics
        self._new = metrics.reports.labels("new")
        self._duplicate = metrics.reports.labels("duplicate")

    def refusal(self, token: str, body: ReportIn) -> str | None:
        """Why this token may not send this report (-> 403), or None."""
        p = self.auth.identify(token, claimed_node=body.node)
        if p is None:
            # a valid token of another node, or garbage: both are refused for this node
            return f"token not valid for node {body.node}"
        if p.role == "read":
            return "read token cannot report"
        return None

    async def accept(self, body: ReportIn) -> tuple[int, bytes]:
        """Store the report; (202, body) when new, (200, body) for a duplicate, after commit."""
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
        except Exception as exc:
            raise StoreUnavailable(f"store unavailable: {exc!r}") from None
        self.metrics.ingest_latency.observe(time.perf_counter() - start)
        (self._new if new else self._duplicate).inc()
        if new and body.metrics.get("spool_replayed"):
            self.metrics.spool_replayed.inc()
        payload = b'{"report_id":"%s","stored":%s}' % (
            report_id.encode(),
            b"true" if new else b"false",
        )
        return (202 if new else 200), payload


def _body_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """The 422 shape FastAPI gives for a declared body. A body that is not JSON at all comes
    back from pydantic with the raw bytes as its input, which may not even be UTF-8: that is
    not echoed (FastAPI does the same)."""
    errors: list[dict[str, Any]] = []
    for e in exc.errors(include_url=False):
        err: dict[str, Any] = {**e, "loc": ("body", *e["loc"])}
        if isinstance(err.get("input"), bytes | bytearray):
            err["input"] = {}
        errors.append(err)
    return errors


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

    ingest = app.state.ingest = Ingest(store, auth, metrics)

    async def handle_report(request: Request) -> Response:
        """POST /api/v1/reports, every case. Runs as the route's whole handler (see
        _handled_by): auth header first, then the raw body validated by pydantic-core in one
        step, then the batching writer; 202 only after the report's transaction has committed.
        In the server, well-formed authorised reports take the ASGI fast path
        (fastpath.IngestFastPath) and everything else lands here."""
        token = _bearer(request)
        raw = await request.body()
        try:
            body = ReportIn.model_validate_json(raw)
        except ValidationError as exc:
            raise RequestValidationError(_body_errors(exc), body=raw) from None
        refusal = ingest.refusal(token, body)
        if refusal is not None:
            raise HTTPException(403, refusal)
        try:
            status, payload = await ingest.accept(body)
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
