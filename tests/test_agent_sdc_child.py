"""GPU work never lives in the agent (issue 41, deliverable 6): the SDC test the controller
orders runs in a short-lived child process. A real agent process takes the order from a
stand-in controller (the orders ride on its answers to reports, as the real one's do); after
the test the agent has not loaded torch, its RSS is where it was before the test, and the fake
NVML lists no process on any GPU. The child itself is bounded: killed at its timeout or over
its memory limit, and a child that dies or talks nonsense is no verdict, never a pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from babysitter.checks.sdc import child
from babysitter.devcluster.fakenvml import FakeGpus
from babysitter.finding import Finding, no_verdict
from tests.fixtures.gpu import babysitter_env
from tests.fixtures.slurm import wait_for

STANDIN_CUPY = Path(__file__).parent / "fixtures" / "standin_cupy"
RSS_SLACK_KB = 5 * 1024  # the bound: RSS after a test within 5 MB of before it


class StandinController:
    """Takes reports, answers with `orders`; wait() blocks until a report matches."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.orders: list[dict[str, str]] = []
        self.cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.cond:
                    outer.reports.append(body)
                    answer = json.dumps({"orders": outer.orders}).encode()
                    outer.cond.notify_all()
                self.send_response(202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, pred: Callable[[dict[str, Any]], bool], after: int = 0, timeout: float = 120):
        """The first report from index `after` on that matches; its index."""
        with self.cond:
            found: list[int] = []

            def seen() -> bool:
                found[:] = [i for i in range(after, len(self.reports)) if pred(self.reports[i])]
                return bool(found)

            assert self.cond.wait_for(seen, timeout), "no such report from the agent"
            return found[0]

    def order(self, oid: str) -> None:
        with self.cond:
            self.orders = [{"check": "sdc.matmul", "id": oid}]


def sdc_done(oid: str) -> Callable[[dict[str, Any]], bool]:
    return lambda r: (r.get("metrics", {}).get("sdc") or {}).get("order") == oid


def full(r: dict[str, Any]) -> bool:
    return r.get("kind") == "full"


@pytest.fixture
def controller() -> Iterator[StandinController]:
    c = StandinController()
    yield c
    c.server.shutdown()


def vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return out


def gpu_processes(gpus: FakeGpus, lib: Path) -> dict[int, list[int]]:
    """What NVML (the fake, through the real pynvml) lists as compute processes per GPU."""
    code = (
        "import json, pynvml as n\n"
        "n.nvmlInit()\n"
        "print(json.dumps({i: [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses("
        "n.nvmlDeviceGetHandleByIndex(i))] for i in range(n.nvmlDeviceGetCount())}))\n"
    )
    env = {**os.environ, **gpus.env(lib)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return {int(k): v for k, v in json.loads(out.stdout).items()}


def start_agent(env: dict[str, str], tmp_path: Path, url: str) -> subprocess.Popen[bytes]:
    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    env = {
        **env,
        "BABYSITTER_AGENT__CONTROLLER_URL": url,
        "BABYSITTER_AGENT__NODE_NAME": "node1",
        "BABYSITTER_AGENT__TOKEN_FILE": str(token),
        "BABYSITTER_AGENT__SPOOL_PATH": str(tmp_path / "state" / "spool.db"),
        "BABYSITTER_AGENT__INTERVAL_S": "0.5",
        "BABYSITTER_AGENT__ENABLED_CHECKS": '["sdc.matmul"]',
        "BABYSITTER_CHECKS__SDC__SIZE": "256",
    }
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 (lives as long as the agent)
    return subprocess.Popen(
        [sys.executable, "-m", "babysitter.cli.main", "agent"], env=env, stdout=log, stderr=log
    )


@pytest.fixture
def context_dir() -> Iterator[Path]:
    # short: the fake keeps state values under 128 bytes
    with tempfile.TemporaryDirectory(prefix="ctx") as d:
        yield Path(d)


def run_order(agent: subprocess.Popen[bytes], controller: StandinController, oid: str):
    """Order one SDC test once the agent has settled; (RSS before, RSS after, its sdc metric)."""
    first = controller.wait(full)
    settled = controller.wait(full, after=first + 3)  # past start-up: a few reports shipped
    before = vm_rss_kb(agent.pid)
    controller.order(oid)
    done = controller.wait(sdc_done(oid), after=settled)
    controller.wait(full, after=done + 2)  # reports shipped after the test, too
    after = vm_rss_kb(agent.pid)
    return before, after, controller.reports[done]["metrics"]["sdc"]


def test_an_ordered_sdc_test_with_torch_leaves_the_agent_as_small_as_before(
    gpus, fakenvml_lib, tmp_path, controller
):
    env = babysitter_env(gpus, fakenvml_lib, tmp_path, checks__sdc__backend="torch")
    agent = start_agent(env, tmp_path, controller.url)
    try:
        before, after, sdc = run_order(agent, controller, "o1")
        maps = Path(f"/proc/{agent.pid}/maps").read_text()
        left = children(agent.pid)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    assert sdc["ran"] and sdc["code"] == "sdc.passed", sdc
    assert sdc["library"].startswith("torch-")
    assert "/torch/" not in maps, "torch was loaded into the agent"
    assert abs(after - before) <= RSS_SLACK_KB, f"agent RSS {before} kB -> {after} kB"
    assert left == []


def test_an_ordered_sdc_test_leaves_no_babysitter_process_on_any_gpu(
    gpus, fakenvml_lib, tmp_path, controller, context_dir
):
    """auto picks the GPU library (a cupy stand-in that holds a context on each GPU it used
    until its process ends, as CUDA does): after the test, NVML lists nobody on any GPU."""
    gpus.contexts(context_dir)
    env = babysitter_env(gpus, fakenvml_lib, tmp_path, checks__sdc__backend="auto")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STANDIN_CUPY), env.get("PYTHONPATH")]))
    agent = start_agent(env, tmp_path, controller.url)
    try:
        _, _, sdc = run_order(agent, controller, "o1")
        held = gpu_processes(gpus, fakenvml_lib)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    assert sdc["ran"] and sdc["code"] == "sdc.passed", sdc
    assert sdc["library"] == "cupy-0.0-standin"
    assert sorted(sdc["gflops"]) == [f"cuda:{i}" for i in range(8)]  # it did use the GPUs
    assert held == {i: [] for i in range(8)}


def test_the_fake_nvml_lists_a_process_holding_a_gpu_context(gpus, fakenvml_lib, context_dir):
    """What the test above relies on: a process with a context is seen, and gone once it
    lets go."""
    gpus.contexts(context_dir)
    fd = os.open(gpus.context_file(3), os.O_RDWR | os.O_CREAT)
    try:
        assert gpu_processes(gpus, fakenvml_lib)[3] == [os.getpid()]
    finally:
        os.close(fd)
    assert gpu_processes(gpus, fakenvml_lib)[3] == []


# ---- the child's bounds, through run_child with a stand-in python


def standin_python(tmp_path: Path, body: str) -> str:
    """An executable that ignores `-m worker` and runs `body` (a shell script)."""
    p = tmp_path / "python"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    # a typo in a test's script must fail here, not read as the child failing
    subprocess.run(["sh", "-n", str(p)], check=True)
    return str(p)


REQ = child.ChildRequest("numpy", 64, "float32", 1, check_name="sdc.matmul")


def test_a_child_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    pidfile = tmp_path / "grandchild"
    py = standin_python(tmp_path, f"sleep 600 & echo $! > {pidfile}; wait")
    with pytest.raises(child.ChildFailed) as exc:
        child.run_child(REQ, timeout_s=1, max_rss_mb=1000, python=py)
    assert exc.value.timed_out and "did not finish within 1 s" in str(exc.value)
    grandchild = int(pidfile.read_text())
    state = Path(f"/proc/{grandchild}/stat")

    def ended() -> bool:
        # gone, or a zombie waiting for init to reap it: nothing of it runs on
        try:
            return state.read_text().split()[2] in ("Z", "X")
        except FileNotFoundError:
            return True

    # SIGKILL is sent to the whole group; the kernel finishes each member on its own time
    # (under load the grandchild was seen still 'R' the instant run_child returned)
    wait_for(ended, timeout_s=30, what=f"the grandchild {grandchild} to end")


def test_a_child_over_its_memory_limit_is_killed(tmp_path):
    # 64 MB resident in a python of its own, far over a 20 MB limit
    grow = (
        f"exec {sys.executable} -c "
        '\'import time; b = bytearray(64 << 20); b[::4096] = b"x" * len(b[::4096]); '
        "time.sleep(600)'"
    )
    with pytest.raises(child.ChildFailed) as exc:
        child.run_child(REQ, timeout_s=120, max_rss_mb=20, python=standin_python(tmp_path, grow))
    assert not exc.value.timed_out and "max_rss_mb = 20" in str(exc.value)


@pytest.mark.parametrize(
    "body, why",
    [
        ("kill -SEGV $$", "killed by signal 11"),
        ("echo 'CUDA error: an illegal memory access' >&2; exit 1", "illegal memory access"),
        ("echo 'not json'", "reply is not valid"),
        ('echo \'{"ok": true, "devices": [], "findings": []}\'', "no verdict for some device"),
        ('echo \'{"ok": false, "error": "weird", "message": "x"}\'', "unknown error"),
    ],
)
def test_a_child_that_dies_or_talks_nonsense_is_no_verdict(tmp_path, body, why):
    with pytest.raises(child.ChildFailed) as exc:
        child.run_child(REQ, timeout_s=60, max_rss_mb=1000, python=standin_python(tmp_path, body))
    assert why in str(exc.value)


def test_a_child_that_cannot_start_is_no_verdict(tmp_path):
    with pytest.raises(child.ChildFailed, match="cannot start the SDC test child"):
        child.run_child(REQ, timeout_s=60, max_rss_mb=1000, python=str(tmp_path / "missing"))


def test_the_check_reports_a_dead_child_as_no_verdict(gpus, fakenvml_lib, tmp_path):
    """`babysitter check --only sdc.matmul` with a child that is killed: exit 3 (unknown),
    a check.error finding, never sdc.passed."""
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        checks__sdc__backend="numpy",
        checks__sdc__size="4096",  # seconds of work: the first memory poll sees it
        checks__sdc__max_rss_mb="1",  # any python is over 1 MB: the child is always killed
        agent__spool_path=str(tmp_path / "state" / "spool.db"),
    )
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "check", "--only", "sdc.matmul", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    found = [Finding.from_dict(d) for d in json.loads(r.stdout)]
    assert [f.code for f in found] == ["check.error"]
    assert no_verdict(found[0]) and "max_rss_mb" in found[0].message
    assert r.returncode == 3
