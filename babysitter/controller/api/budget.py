"""How many requests one sender may have in flight, checked from the headers before any of the
body is read (an ASGI middleware in front of everything else).

A body may take up to controller.body_timeout_s to arrive (connguard.py), so without a bound
one client trickling bodies could hold every connection the controller has: the login form
needs no token at all, and a report needs only one node's token. Each such sender gets a small
budget of requests in flight; past it the request is answered 429 at once (Retry-After, and the
connection closed: the rest of its body is never read), so the rest of the fleet's reports,
/healthz and the API keep their connections:

- a report with a valid node token: `per_node` in flight for that node (an agent sends one at
  a time);
- the login form (no token): `login` in flight from all clients together, and a quarter of that
  from one client address;
- any other request without a valid token (health, metrics, the status page's cookie views, a
  report or an admin request refused from its headers): `per_client` in flight from one client
  address, so one address flooding even fast routes cannot hold every connection.

Requests with the admin or read token are trusted and not bounded here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from babysitter.controller.api.auth import NODE_HEADER, Authenticator, Principal
from babysitter.controller.api.ingress import bearer_token

_NODE = NODE_HEADER.encode()
Key = tuple[str, str]


class RequestBudget:
    def __init__(
        self,
        app: ASGIApp,
        auth: Authenticator,
        reports_path: str,
        login_path: str,
        per_node: int,
        login: int,
        per_client: int = 32,
    ) -> None:
        self.app = app
        self.auth = auth
        self.reports_path = reports_path
        self.login_path = login_path
        self.limits: dict[str, int] = {
            "node": per_node,
            "login": login,
            "login-client": max(1, login // 4),
            "client": per_client,
        }
        self.in_flight: Counter[Key] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keys = self.keys(scope) if scope["type"] == "http" else []
        if any(self.in_flight[k] >= self.limits[k[0]] for k in keys):
            await _too_many(send)
            return
        self.in_flight.update(keys)
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight.subtract(keys)
            for k in keys:
                if self.in_flight[k] <= 0:
                    del self.in_flight[k]

    def keys(self, scope: Scope) -> list[Key]:
        """The budgets a request counts against (none: not bounded here)."""
        client = scope.get("client")
        address = str(client[0]) if client else ""
        if scope["method"] == "POST" and scope["path"] == self.login_path:
            return [("login", ""), ("login-client", address)]
        p = self._sender(scope["headers"])
        if p is None:
            return [("client", address)]
        if p.role == "node" and p.node is not None:
            return [("node", p.node)]
        return []  # the admin or read token

    def _sender(self, headers: Iterable[tuple[bytes, bytes]]) -> Principal | None:
        """Who the headers prove sends the request: a node (a valid token for the node it
        names), the admin or read token; None for anyone else."""
        auth = node = None
        for name, value in headers:
            if name == b"authorization" and auth is None:
                auth = value.decode("latin-1")
            elif name == _NODE and node is None:
                node = value.decode("latin-1")
        token = bearer_token(auth or "")
        return None if token is None else self.auth.sender(token, node)


async def _too_many(send: Send) -> None:
    body = b'{"detail":"too many requests in flight from this sender"}'
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
