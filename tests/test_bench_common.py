"""The benchmarks' one readiness wait (bench/common.py): it returns once the controller is
ready and raises otherwise, so no benchmark measures a controller that never came up."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.common import wait_ready, wait_until
from tests.fixtures.controller import free_port


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/readyz" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def ready_server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_wait_ready_returns_once_readyz_answers(ready_server: str):
    wait_ready(ready_server, 30)


def test_wait_ready_raises_when_nothing_becomes_ready():
    with pytest.raises(TimeoutError, match="/readyz"):
        wait_ready(f"http://127.0.0.1:{free_port()}", 0.5)


def test_wait_ready_fails_at_once_with_the_log_of_a_controller_that_exited(tmp_path: Path):
    log = tmp_path / "ctl.log"
    log.write_text("config error: controller.listen: not an address\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(timeout=30)
    with pytest.raises(RuntimeError, match=r"exited with 3.*not an address"):
        wait_ready(f"http://127.0.0.1:{free_port()}", 300, proc=proc, log=log)


def test_wait_until_names_what_it_waited_for():
    with pytest.raises(TimeoutError, match="node7 drained"):
        wait_until(lambda: False, 0.3, poll=0.05, what="node7 drained")
    assert wait_until(lambda: True, 0.3) >= 0
