"""An ASGI fast path in front of the API for the one hot request: a well-formed report from a
node with a valid token (10k nodes every 5 s). It skips Starlette's middleware, routing and
request objects (~20 % of the controller's CPU per report) and answers with the same bytes the
FastAPI route would. Anything else, including every error case found before the store, is
passed to the FastAPI app, so the app stays the one source of the API's behaviour, error
format and OpenAPI; the store's own refusals (422, 503) come after the body is consumed and
are answered with the route's response functions (api.refused, api.unavailable).
tests/test_report_route_parity.py holds both doors to the same bytes. The sender is checked
from the headers before any of the body is read: a refused sender or a declared length over
the limit goes to the app with the body untouched (the app refuses it without reading), and a
streamed body is read only up to the limit."""

from __future__ import annotations

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from babysitter.controller.api.app import REPORTS_PATH, refused, unavailable
from babysitter.controller.api.auth import NODE_HEADER
from babysitter.controller.api.ingress import Ingest, Refused, StoreUnavailable, report_problems
from babysitter.report import Report
from babysitter.wire import HEADER_BYTES, WIRE_VERSION

# the answer says the controller's wire version (babysitter/wire.py): the agent learns it
_JSON_HEADERS = [(b"content-type", b"application/json"), (HEADER_BYTES, b"%d" % WIRE_VERSION)]
_NODE_HEADER = NODE_HEADER.encode()


class IngestFastPath:
    """`app` (from api.create_app) behind the fast path; `ingest` is the same ingest service
    the app's report route was built with, so both answer alike."""

    def __init__(self, app: ASGIApp, ingest: Ingest) -> None:
        self.app = app
        self.ingest = ingest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != REPORTS_PATH:
            await self.app(scope, receive, send)
            return
        # a repeated header counts by its first value, as Starlette's request.headers.get
        auth = node = length = None
        for name, value in scope["headers"]:
            if name == b"authorization" and auth is None:
                auth = value.decode("latin-1")  # as Starlette decodes headers
            elif name == _NODE_HEADER and node is None:
                node = value.decode("latin-1")
            elif name == b"content-length" and length is None:
                length = value.decode("latin-1")
        try:
            sender = self.ingest.sender(auth, node, length)
        except Refused:
            await self.app(scope, receive, send)  # refused by the app, body unread
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
            if size > self.ingest.max_body:  # the app reads one more chunk and answers 413
                await self.app(scope, _replay(chunks, True, receive), send)
                return
        raw = b"".join(chunks)
        body = _well_formed(raw)
        if (
            body is None
            or size > self.ingest.max_body
            or report_problems(raw, body)
            or self.ingest.refusal(sender, body) is not None
        ):
            await self.app(scope, _replay([raw], False, receive), send)
            return
        try:
            status, payload = await self.ingest.accept(body)
        except Refused as exc:  # the route's own answers, byte for byte
            self.ingest.count_refused(exc.status)
            await refused(exc)(scope, receive, send)
            return
        except StoreUnavailable as exc:
            self.ingest.count_refused(503)
            await unavailable(exc)(scope, receive, send)
            return
        headers = [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _well_formed(raw: bytes) -> Report | None:
    try:
        return Report.model_validate_json(raw)
    except ValidationError:
        return None


def _replay(chunks: list[bytes], more: bool, receive: Receive) -> Receive:
    """A receive channel that first hands the app the body already read, then the rest."""
    pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": more}]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay
