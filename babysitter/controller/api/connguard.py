"""A connection guard around uvicorn's HTTP protocol (h11).

uvicorn times out idle keep-alive connections only after a first response: a connection that
never finishes its headers (a slow-header client, or a thousand idle sockets, no token needed)
is kept forever, and enough of them exhaust the controller's file descriptors, so every report
is refused and the policy loop fails to open the database. Here a connection with no request in
flight is closed after `header_timeout_s`, and past `max_connections` the oldest idle ones are
closed as a new one arrives: idle connections make room, requests in flight are never cut."""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

# descriptors kept for everything but HTTP clients: the database, Slurm commands, logs
FD_RESERVE = 128


def connection_cap(max_connections: int) -> int:
    """max_connections, kept FD_RESERVE below this process's descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(16, min(max_connections, soft - FD_RESERVE))


def guarded_protocol(header_timeout_s: float, cap: int) -> type[H11Protocol]:
    class Guarded(_Guarded):
        pass

    Guarded.header_timeout_s = header_timeout_s
    Guarded.cap = cap
    return Guarded


class _Guarded(H11Protocol):
    header_timeout_s = 10.0
    cap = 4096

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.opened_at = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()
        self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request's headers get the same time

    def idle(self) -> bool:
        """No request in flight: headers not complete yet, or the last response sent."""
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expire)

    def _expire(self) -> None:
        if self.idle():
            self.drop()

    def drop(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _make_room(self) -> None:
        excess = len(self.connections) - self.cap
        if excess <= 0:
            return
        idle: list[Any] = sorted(
            (c for c in self.connections if isinstance(c, _Guarded) and c is not self and c.idle()),
            key=lambda c: c.opened_at,
        )
        for c in idle[:excess]:
            c.drop()
