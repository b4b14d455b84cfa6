"""An ASGI fast path in front of the API for the one hot request: a well-formed report from a
node with a valid token (10k nodes every 5 s). It skips Starlette's middleware, routing and
request objects (~20 % of the controller's CPU per report) and answers with the same bytes the
FastAPI route would. Anything else, including every error case of a report, is passed to the
FastAPI app unchanged, so the app stays the one source of the API's behaviour, error format
and OpenAPI."""

from __future__ import annotations

import json

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from babysitter.controller.api import Ingest, ReportIn, StoreUnavailable, bearer_token

REPORTS_PATH = "/api/v1/reports"
# Bigger bodies are legal (up to 10,000 findings) but not the hot path: the app handles them.
MAX_FAST_BODY = 1 << 20
_JSON_HEADERS = [(b"content-type", b"application/json")]


class IngestFastPath:
    def __init__(self, app: ASGIApp, ingest: Ingest, max_body: int = MAX_FAST_BODY) -> None:
        self.app = app
        self.ingest = ingest
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != REPORTS_PATH:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away mid-body
                return
            chunk = msg.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if not msg.get("more_body", False):
                break
            if size > self.max_body:
                await self.app(scope, _replay(chunks, True, receive), send)
                return
        raw = b"".join(chunks)
        body = _well_formed(raw)
        token = _bearer(scope)
        if body is None or token is None or self.ingest.refusal(token, body) is not None:
            await self.app(scope, _replay([raw], False, receive), send)
            return
        try:
            status, payload = await self.ingest.accept(body)
        except StoreUnavailable as exc:
            status, payload = 503, json.dumps({"detail": str(exc)}).encode()
        headers = [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def with_fast_ingest(app: FastAPI) -> IngestFastPath:
    """The ASGI app to serve: `app` (from api.create_app) behind the ingest fast path."""
    return IngestFastPath(app, app.state.ingest)


def _well_formed(raw: bytes) -> ReportIn | None:
    try:
        return ReportIn.model_validate_json(raw)
    except ValidationError:
        return None


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return bearer_token(value.decode("latin-1"))  # as Starlette decodes headers
    return None


def _replay(chunks: list[bytes], more: bool, receive: Receive) -> Receive:
    """A receive channel that first hands the app the body already read, then the rest."""
    pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": more}]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay
