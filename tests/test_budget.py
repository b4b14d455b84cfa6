"""Requests in flight per sender (controller/api/budget.py), in-process: one address, one node
token or the login form cannot hold more than their small share, everyone else goes on."""

from __future__ import annotations

import asyncio

from babysitter.controller.api.auth import Authenticator, node_token
from babysitter.controller.api.budget import RequestBudget

SECRET = b"s" * 32


def scope(path: str, method: str = "GET", client: str = "10.0.0.1", **headers: str) -> dict:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "client": (client, 40000),
        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
    }


def test_each_sender_gets_its_share_and_no_more():
    async def run() -> dict[str, list[int]]:
        hold = asyncio.Event()

        async def app(scope, receive, send):  # a handler whose body never finishes arriving
            await hold.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        auth = Authenticator(SECRET, "admin-token", "read-token")
        budget = RequestBudget(
            app, auth, "/api/v1/reports", "/ui/login", per_node=2, login=8, per_client=4
        )

        async def status(s: dict) -> int:
            sent: list[dict] = []

            async def send(m: dict) -> None:
                sent.append(m)

            async def receive() -> dict:
                return {"type": "http.request", "body": b"", "more_body": False}

            await budget(s, receive, send)
            return sent[0]["status"]

        node1 = {
            "authorization": f"Bearer {node_token(SECRET, 'node1')}",
            "x_babysitter_node": "node1",
        }
        node2 = {
            "authorization": f"Bearer {node_token(SECRET, 'node2')}",
            "x_babysitter_node": "node2",
        }
        groups = {
            "node1": [scope("/api/v1/reports", "POST", **node1) for _ in range(5)],
            "login from one address": [scope("/ui/login", "POST") for _ in range(5)],
            "anonymous from one address": [scope("/metrics", client="10.0.0.2") for _ in range(6)],
            "node2": [scope("/api/v1/reports", "POST", **node2)],
            "another address": [scope("/healthz", client="10.0.0.3")],
            "admin": [
                scope("/api/v1/nodes", authorization="Bearer admin-token") for _ in range(40)
            ],
        }
        tasks = {k: [asyncio.create_task(status(s)) for s in v] for k, v in groups.items()}
        for _ in range(5):
            await asyncio.sleep(0)  # let every request reach the budget
        hold.set()
        return {k: list(await asyncio.gather(*v)) for k, v in tasks.items()}

    got = asyncio.run(run())
    assert sorted(got["node1"]) == [200, 200, 429, 429, 429]
    assert sorted(got["login from one address"]) == [200, 200, 429, 429, 429]  # 8 // 4
    assert sorted(got["anonymous from one address"]) == [200] * 4 + [429] * 2
    assert got["node2"] == [200] and got["another address"] == [200]
    assert set(got["admin"]) == {200}
