"""The HTTP API (FastAPI): the app, the report route and the error shapes. Contract:
docs/architecture.md. The read, admin and health routes are routers of their own (api_read,
api_admin, api_health); accepting a report is controller/api/ingress.py's, writing it
controller/api/ingest.py's."""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from babysitter import __version__
from babysitter.controller.api.api_admin import admin_router
from babysitter.controller.api.api_health import health_router
from babysitter.controller.api.api_ledger import ledger_router
from babysitter.controller.api.api_read import read_router
from babysitter.controller.api.api_rma import is_upload
from babysitter.controller.api.api_sdc import sdc_router
from babysitter.controller.api.audit_api import audit_router
from babysitter.controller.api.auth import NODE_HEADER, Authenticator, Principal
from babysitter.controller.api.guard_api import guard_router
from babysitter.controller.api.ingress import (
    Ingest,
    Refused,
    StoreUnavailable,
    bearer_token,
    report_problems,
)
from babysitter.controller.api.metrics_snapshot import StoreMetrics
from babysitter.controller.api.ui.routes import LOGIN_PATH, LOGOUT_PATH, MAX_LOGIN_BODY
from babysitter.controller.db.store import Store
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.report import Report
from babysitter.wire import HEADER, WIRE_VERSION

REPORTS_PATH = "/api/v1/reports"
# an accepted report's answer says the controller's wire version (babysitter/wire.py)
_WIRE_HEADERS = {HEADER: str(WIRE_VERSION)}
# a 422 names the field and shows at most this much of what was sent
MAX_ECHO_CHARS = 200
MAX_ERRORS = 20
# bodies of the admin endpoints (drain reason, ...) are tiny
MAX_ADMIN_BODY = 64 * 1024


Dependency = Callable[[Request], Principal]  # the reader / admin checks routes depend on


class Order(BaseModel):
    check: str  # the ordered check the agent runs now (sdc.matmul)
    id: str  # the agent reports it back with the result
    # its binding (controller/loop/admit/order_permission.py): optional, an older agent ignores them
    node: str | None = None  # the node it is for: an agent refuses another node's
    episode: int | None = None  # the ledger row that ordered it (none for an SDC test)
    expires_at: str | None = None  # ISO 8601; an agent refuses it after (with a clock margin)


class Accepted(BaseModel):
    report_id: str
    stored: bool
    # present when the controller wants something of the node (controller/api/orders.py)
    orders: list[Order] | None = None


def _bearer(request: Request) -> str:
    """The bearer token, or 401."""
    token = bearer_token(request.headers.get("authorization", ""))
    if token is None:
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    return token


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
    ingest: Ingest,
    state: dict[str, Any] | None = None,
    extra: Sequence[
        Callable[[Callable[[Request], Principal], Callable[[Request], Principal]], APIRouter]
    ] = (),
    store_metrics: StoreMetrics | None = None,
    metrics_token: str | None = None,
) -> FastAPI:
    """The API: the report route (served by `ingest`, which the fast path in front of the
    app shares), the read, admin and health routers, and the error shapes they answer with.
    `extra`: more routers (the status page, maintenance), each made from the reader and admin
    dependencies. `store_metrics`: the published store-derived values /metrics sends (one of
    its own when None); `metrics_token`: /metrics then needs it (or the admin/read token)."""
    app = FastAPI(title="babysitter controller", version=__version__)
    runtime_state = state if state is not None else {}
    if store_metrics is None:
        store_metrics = StoreMetrics(store, metrics, runtime_state)
    app.add_middleware(AdminBodyGuard, auth=auth)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own handler echoes every input whole
        return JSONResponse(
            {"detail": jsonable_encoder(bounded_errors(exc.errors()))}, status_code=422
        )

    reader, admin = access(auth)
    app.include_router(report_router(ingest))
    app.include_router(read_router(store, runtime_state, reader))
    app.include_router(sdc_router(store, reader))
    app.include_router(admin_router(store, admin))
    app.include_router(ledger_router(store, reader, admin))
    app.include_router(guard_router(store, reader))
    app.include_router(audit_router(store, reader))
    app.include_router(
        health_router(store, store_metrics, runtime_state, metrics_guard(auth, metrics_token))
    )
    for make in extra:
        app.include_router(make(reader, admin))
    return app


def access(
    auth: Authenticator,
) -> tuple[Callable[[Request], Principal], Callable[[Request], Principal]]:
    """The two dependencies of the non-report routes: a reader (admin or read token) and an
    admin."""

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

    return reader, admin


def metrics_guard(auth: Authenticator, token: str | None) -> Callable[[Request], None] | None:
    """The check of a /metrics request where a metrics token is configured: that token, or
    the admin or read token (401 without a token, 403 with another one)."""
    if not token:
        return None
    expected = token.encode()

    def check(request: Request) -> None:
        given = _bearer(request)
        if secrets.compare_digest(given.encode("utf-8", "surrogateescape"), expected):
            return
        p = auth.identify(given)
        if p is None or p.role not in ("admin", "read"):
            raise HTTPException(403, "metrics token required")

    return check


def report_router(ingest: Ingest) -> APIRouter:
    """POST /api/v1/reports."""
    router = APIRouter()

    async def post_report(body: Report) -> Accepted:
        """Declares the route for OpenAPI; requests are served by `handle_report`."""
        raise NotImplementedError  # pragma: no cover

    router.add_api_route(
        REPORTS_PATH,
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
        route_class_override=_handled_by(_report_handler(ingest)),
    )
    return router


def _report_handler(ingest: Ingest) -> Callable[[Request], Awaitable[Response]]:
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
                body = Report.model_validate_json(raw)
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
            ingest.count_refused(exc.status)
            return refused(exc)
        except StoreUnavailable as exc:
            ingest.count_refused(503)
            return unavailable(exc)
        return Response(
            payload, status_code=status, media_type="application/json", headers=_WIRE_HEADERS
        )

    return handle_report


def refused(exc: Refused) -> Response:
    """The answer to a refused report: FastAPI's {"detail": ...} shape. A refusal before the
    whole body was read closes the connection (the rest of the body is never read)."""
    headers = {"connection": "close"} if exc.status in (401, 403, 413) else {}
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(
        jsonable_encoder({"detail": exc.detail}), status_code=exc.status, headers=headers
    )


def unavailable(exc: StoreUnavailable) -> Response:
    """The answer to a report the store could not take now: 503, the agent spools it and
    retries."""
    return JSONResponse({"detail": str(exc)}, status_code=503)


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
            or is_upload(scope["method"], scope["path"])  # a node's, bounded by its route
        ):
            await self.app(scope, receive, send)
            return
        if scope["path"] in (LOGIN_PATH, LOGOUT_PATH):
            # the status page's login form: the token is in the form, not a header; it sets a
            # viewing cookie and writes nothing (ui/routes.py); logout only drops the cookie
            await self.app(scope, _bounded(receive, MAX_LOGIN_BODY), send)
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
