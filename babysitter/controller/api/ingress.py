"""The ingress policy of reports: who may send (from the headers, before the body is read), how
much body is read, what a well-typed report still may not carry, and handing it over to the
batching writer (ingest.py). Used by the FastAPI route (every case) and the ASGI fast path (the
well-formed, authorised case), so both answer alike; both receive it explicitly."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any

from babysitter.controller.api.auth import NODE_HEADER, Authenticator, Principal
from babysitter.controller.api.ingest import ReportRejected, ReportWriter
from babysitter.controller.api.orders import OrderBook
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.report import Report
from babysitter.slurm.base import node_name_problem

log = logging.getLogger(__name__)


# Bounds of one report (the body limit comes from controller.max_body_bytes; the number of
# findings is the report model's own, babysitter.report).
MAX_DETAILS_BYTES = 16 * 1024  # per finding, as JSON
MAX_METRICS_BYTES = 64 * 1024
DEFAULT_MAX_BODY = 1 << 20


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, or None."""
    token = header[7:].strip()
    return token if header[:7].lower() == "bearer " and token else None


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
    refused by the store's JSON encoder; Ingest.accept then names its field in the 422.)"""
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


def report_problems(raw: bytes, body: Report) -> list[dict[str, Any]]:
    """What a well-typed report still may not carry (-> 422), in FastAPI's error shape."""
    errors = _unstorable_values(body) if _suspect(raw) else []
    named = node_name_problem(body.node)  # `ALL` passes the pattern, yet names every node
    if named is not None:
        errors.append(_error(("node",), named))
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


def _unstorable_values(body: Report) -> list[dict[str, Any]]:
    """The first unstorable value of the findings and of the metrics, as 422 errors."""
    errors: list[dict[str, Any]] = []
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
        writer: ReportWriter,
        auth: Authenticator,
        metrics: ControllerMetrics,
        max_body: int = DEFAULT_MAX_BODY,
        orders: OrderBook | None = None,
    ) -> None:
        self.orders = orders  # what the answer to a node's report carries for it
        self.writer = writer
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

    def count_refused(self, status: int) -> None:
        """A report answered with an error (either door: the route or the fast path)."""
        self.metrics.reports_refused.labels(str(status)).inc()

    @property
    def too_large(self) -> str:
        return f"report body larger than {self.max_body} bytes"

    def refusal(self, sender: Principal, body: Report) -> str | None:
        """Why this sender may not send this report (-> 403), or None."""
        if sender.role == "node" and sender.node != body.node:
            # a valid token of another node: refused for this node
            return f"token not valid for node {body.node}"
        return None

    async def accept(self, body: Report) -> tuple[int, bytes]:
        """Store the report; (202, body) when new, (200, body) for a duplicate, after commit.
        Raises Refused(422) when the database refuses this report alone."""
        start = time.perf_counter()
        report_id = str(body.report_id)
        fut = self.writer.submit_async(body)
        try:
            async with asyncio.timeout(30):
                new = await fut
        except ReportRejected as exc:
            # a number past float range (1e400) parses as infinity without the spelling
            # report_problems looks for: found here, off the hot path, to name the field
            named = _unstorable_values(body)
            if not named:
                # the database's own text (SQL, parameters) stays in our log, not the answer
                log.warning(
                    "report %s from %s refused by the database: %s", report_id, body.node, exc
                )
            raise Refused(
                422, named or [_error((), "the database refused it (see the controller's log)")]
            ) from None
        except Exception as exc:
            log.warning("report %s from %s not stored: %r", report_id, body.node, exc)
            raise StoreUnavailable(f"store unavailable ({type(exc).__name__})") from None
        self.metrics.ingest_latency.observe(time.perf_counter() - start)
        (self._new if new else self._duplicate).inc()
        if new:
            self.auth.learn((body.node,))
            if body.metrics.get("spool_replayed"):
                self.metrics.spool_replayed.inc()
        payload = b'{"report_id":"%s","stored":%s%s}' % (
            report_id.encode(),
            b"true" if new else b"false",
            self.orders.answer_part(body.node) if self.orders is not None else b"",
        )
        return (202 if new else 200), payload
