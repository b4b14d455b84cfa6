"""Failed logins, per client address: the login form takes any token typed into it, so without
a bound a script tries tokens as fast as the controller answers (300 in 0.9 s). After `free`
wrong tokens from one address, that address waits before its next try (429 with Retry-After),
the wait doubling with each further wrong token, up to MAX_WAIT_S; a right token clears the
count. A try during the wait is refused unchecked, right token or not, and counts as one more
wrong token (ui/routes.py), so a script hammering the form locks itself out for longer and
longer while a person who waits gets in. Addresses are forgotten oldest first past
MAX_CLIENTS (memory stays bounded)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

FIRST_WAIT_S = 1.0
MAX_WAIT_S = 900.0
MAX_DOUBLINGS = 32  # far past MAX_WAIT_S already
MAX_CLIENTS = 10_000


@dataclass
class _Failures:
    count: int = 0
    until: float = 0.0  # monotonic time before which this address may not try


class LoginThrottle:
    def __init__(self, free: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.free = free
        self.clock = clock
        self._clients: OrderedDict[str, _Failures] = OrderedDict()

    def wait_s(self, client: str) -> float:
        """Seconds `client` must still wait before its next try (0: it may try now)."""
        f = self._clients.get(client)
        return 0.0 if f is None else max(0.0, f.until - self.clock())

    def failed(self, client: str) -> float:
        """A wrong token from `client`: the wait before its next try."""
        f = self._clients.pop(client, None) or _Failures()
        f.count += 1
        if f.count >= self.free:
            # the exponent bounded: 2**1024 is no float (OverflowError: a 500 that lost the
            # address's count, so a script hammering the form got its free tries back)
            doublings = min(f.count - self.free, MAX_DOUBLINGS)
            f.until = self.clock() + min(MAX_WAIT_S, FIRST_WAIT_S * 2**doublings)
        self._clients[client] = f  # the newest at the end
        while len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)
        return self.wait_s(client)

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)
