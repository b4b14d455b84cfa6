"""A tiny local HTTP receiver that records JSON POSTs: the demo's stand-in for Slack/PagerDuty
and the tests' webhook endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.requests: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("content-length", 0) or 0)
                raw = self.rfile.read(n)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with outer._lock:
                    outer.requests.append((self.path, body))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        # shutdown() waits for the loop's next poll: at the default 0.5 s, every test and
        # demo that closes a receiver waited half a second for it
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def bodies(self, path: str) -> list[Any]:
        with self._lock:
            return [b for p, b in self.requests if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
