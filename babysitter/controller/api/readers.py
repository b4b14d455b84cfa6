"""Bounded readers: the status page (/ui...) and /metrics, an ASGI middleware in front of the
app, checked from the path and the client address before anything else runs.

- A rate per client address (a token bucket for each kind of reader: `ui`, `metrics`): a
  client may make `burst` requests at once and `per_s` per second on average; past it the
  request is answered 429 at once with Retry-After (the seconds until its next token).
- A worker budget of their own: at most `workers` reader requests are served at once, all
  clients together; up to `queue` more wait for one (on the event loop, holding no thread),
  and past that they are answered 429 too. Reports, the API and the loops never wait behind
  readers: however many tabs and scrapers there are, they hold `workers` threads at most.

Behind a proxy every browser has the proxy's address: raise the ui rate there
(docs/deploy.md)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from babysitter.config import ControllerConfig

# client addresses remembered per kind of reader (the least recently seen are forgotten first:
# a forgotten client starts again with a full bucket, it never gets less)
MAX_CLIENTS = 10_000


@dataclass(frozen=True)
class Limit:
    per_s: float
    burst: int


def reader_limits(c: ControllerConfig) -> dict[str, Limit]:
    """The limits from the controller's config section."""
    return {
        "ui": Limit(c.ui_requests_per_s, c.ui_burst),
        "metrics": Limit(c.metrics_requests_per_s, c.metrics_burst),
    }


def reader_kind(path: str) -> str | None:
    """Which reader a path belongs to (None: not a reader, not bounded here)."""
    if path == "/metrics":
        return "metrics"
    if path == "/ui" or path.startswith("/ui/"):
        return "ui"
    return None


class TokenBuckets:
    """One token bucket per key: `burst` tokens, refilled at `per_s`."""

    def __init__(self, limit: Limit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def take(self, key: str) -> float:
        """Take a token for `key`: 0 when there was one, else the seconds until there is."""
        now = self.clock()
        tokens, at = self._buckets.pop(key, (float(self.limit.burst), now))
        tokens = min(float(self.limit.burst), tokens + (now - at) * self.limit.per_s)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.limit.per_s
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > MAX_CLIENTS:
            self._buckets.popitem(last=False)
        return wait


class ReaderGate:
    def __init__(
        self,
        app: ASGIApp,
        limits: dict[str, Limit],
        workers: int,
        queue: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.buckets = {kind: TokenBuckets(limit, clock) for kind, limit in limits.items()}
        self.workers = workers
        self.queue = queue
        self.waiting = 0
        self._slots: asyncio.Semaphore | None = None  # made on the server's event loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = reader_kind(scope["path"]) if scope["type"] == "http" else None
        bucket = None if kind is None else self.buckets.get(kind)
        if bucket is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        wait = bucket.take(str(client[0]) if client else "")
        if wait > 0:
            await _too_many(send, wait, f"more {kind} requests than this client's rate")
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        if self._slots.locked() and self.waiting >= self.queue:
            await _too_many(send, 1.0, "every reader worker busy")
            return
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._slots.release()


async def _too_many(send: Send, retry_after_s: float, why: str) -> None:
    body = b'{"detail":"too many requests: ' + why.encode() + b'"}'
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(max(1, math.ceil(retry_after_s))).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
