"""A connection guard around uvicorn's HTTP protocol (h11).

uvicorn times out idle keep-alive connections only after a first response, and a request whose
body is still arriving has no timeout at all: a connection that never finishes its headers, or
one that trickles its body a byte at a time (no token needed for /ui/login), is kept forever,
and enough of them exhaust the controller's file descriptors, so every report is refused and
the policy loop fails to open the database. Here:

- a connection with no request in flight is closed after `header_timeout_s`;
- a request's body must arrive whole within `body_timeout_s` of its headers, else the
  connection is closed (the handler sees a disconnect); a request read whole is never cut;
- past `cap` connections the oldest idle ones are closed as a new one arrives, and when none
  is idle the new one is closed at once: the cap is a hard bound, kept below the descriptor
  limit (`connection_cap`), so the process never runs out of descriptors for its database,
  Slurm commands and alert sockets.

How many requests one sender may have in flight is budget.py's."""

from __future__ import annotations

import asyncio
import logging
import resource
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

# descriptors kept for everything but HTTP clients: the database, Slurm commands, alert
# sockets, logs, the listening socket
FD_RESERVE = 128


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit (a service started
    without LimitNOFILE gets 1024 soft); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # a container may refuse: keep what we have
            log.warning("cannot raise the file descriptor limit to %s: %s", target, exc)
    return soft


def connection_cap(max_connections: int) -> int:
    """max_connections, kept FD_RESERVE below this process's descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(16, min(max_connections, soft - FD_RESERVE))


def guarded_protocol(
    header_timeout_s: float, cap: int, body_timeout_s: float = 30.0
) -> type[H11Protocol]:
    class Guarded(_Guarded):
        pass

    Guarded.header_timeout_s = header_timeout_s
    Guarded.body_timeout_s = body_timeout_s
    Guarded.cap = cap
    return Guarded


class _Guarded(H11Protocol):
    header_timeout_s = 10.0
    body_timeout_s = 30.0
    cap = 4096

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.opened_at = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None
        self._timed: object = None  # the request whose body deadline is armed
        self._arm(self.header_timeout_s)
        if not self._make_room():
            self.drop()  # every connection busy: this one waits for nothing, not a descriptor

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None and self.cycle is not self._timed:
            # headers complete: the body gets its own time, from now
            self._timed = self.cycle
            self._arm(self.body_timeout_s)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm(self.header_timeout_s)  # the next request's headers get the same time

    def idle(self) -> bool:
        """No request in flight: headers not complete yet, or the last response sent."""
        return self.cycle is None or self.cycle.response_complete

    def reading(self) -> bool:
        """The client still owes us part of a request: headers or body."""
        return self.idle() or bool(self.cycle is not None and self.cycle.more_body)

    def _arm(self, after_s: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(after_s, self._expire)

    def _expire(self) -> None:
        if self.reading():
            self.drop()

    def drop(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _make_room(self) -> bool:
        """Close the oldest idle connections past the cap; False: still past it. Connections
        already closing count as gone (their descriptors go with this loop iteration)."""
        live = [
            c for c in self.connections if isinstance(c, _Guarded) and not c.transport.is_closing()
        ]
        excess = len(live) - self.cap
        if excess <= 0:
            return True
        idle = sorted((c for c in live if c is not self and c.idle()), key=lambda c: c.opened_at)
        for c in idle[:excess]:
            c.drop()
        return len(idle) >= excess
