"""Shared plumbing of the benchmarks that run against a real 10,000-node slurmctld
(bench/rack_failure.py, bench/slurm_load.py): the devcluster with slurmd-less nodes, a real
controller subprocess (real cli/rest Slurm backend, real store, retention thread), an open-loop
ingest generator at the design rate, and slurmctld's own meters (`sdiag` per message type, CPU
time of the slurmctld process from /proc).

`python -m bench.bigcluster controller` is the controller the benchmarks start: the real
`Controller`, with each background loop's start time and duration appended to
$BENCH_TICK_LOG (the only addition; the loops themselves are untouched)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from babysitter.controller.api.auth import node_token
from babysitter.devcluster import ClusterInfo, DevCluster
from bench.common import percentile, summary, wait_ready

N_FAKE = 10_000
RATE = 2000.0  # reports/s: 10,000 nodes every 5 s
POOL = 128  # keep-alive connections of the open-loop generator
CLK_TCK = os.sysconf("SC_CLK_TCK")
PLACEHOLDER = "00000000-0000-4000-8000-000000000000"
TS_PLACEHOLDER = "2000-01-01T00:00:00.000000+00:00"
SDIAG_SELF = "REQUEST_STATS_INFO"  # sdiag's own RPC: left out of every count


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- slurmctld's meters
class Slurmctld:
    def __init__(self, info: ClusterInfo) -> None:
        self.info = info
        self.pid = int(Path(info.base, "run", "slurmctld.pid").read_text().strip())

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime

    def _sdiag(self, *args: str) -> str:
        r = subprocess.run(
            ["sdiag", *args], env=self.info.env(), capture_output=True, text=True, timeout=30
        )
        return r.stdout

    def reset(self) -> None:
        self._sdiag("--reset")

    def rpcs(self) -> dict[str, tuple[int, int]]:
        """message type -> (count, total_time in microseconds) since the last reset."""
        out = self._sdiag()
        part = out.split("Remote Procedure Call statistics by user")[0]
        return {
            m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(
                r"^\s+(\w+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:\d+\s+total_time:(\d+)",
                part,
                re.M,
            )
            if m.group(1) != SDIAG_SELF
        }


@dataclass
class Window:
    """slurmctld's RPCs and CPU over one phase."""

    name: str
    seconds: float
    cpu_s: float
    rpcs: dict[str, tuple[int, int]]

    @property
    def rpc_per_s(self) -> float:
        return sum(c for c, _ in self.rpcs.values()) / self.seconds

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.seconds

    def public(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "slurmctld_cpu_s": round(self.cpu_s, 3),
            "rpc_per_s": round(self.rpc_per_s, 3),
            "rpcs": {k: {"count": c, "total_time_us": t} for k, (c, t) in self.rpcs.items()},
        }


def measure(ctld: Slurmctld, name: str, seconds: float, during: Callable[[], None]) -> Window:
    ctld.reset()
    c0, t0 = ctld.cpu_s(), time.monotonic()
    deadline = t0 + seconds
    while time.monotonic() < deadline:
        during()
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    c1, t1 = ctld.cpu_s(), time.monotonic()
    return Window(name, t1 - t0, c1 - c0, ctld.rpcs())


# ---- the cluster
def cluster_up(base: Path) -> tuple[DevCluster, ClusterInfo, float]:
    t = time.monotonic()
    dc = DevCluster(base, nodes=4, extra_nodes=N_FAKE)
    info = dc.up(timeout_s=120)
    return dc, info, time.monotonic() - t


def node_names(info: ClusterInfo) -> list[str]:
    return info.nodes + info.fake_nodes


def show_nodes(info: ClusterInfo, names: list[str]) -> dict[str, tuple[str, str]]:
    """name -> (State=..., Reason=...) through `scontrol show node -o a,b,...`."""
    r = subprocess.run(
        ["scontrol", "show", "node", "-o", ",".join(names)],
        env=info.env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"NodeName=(\S+)", line)
        st = re.search(r" State=(\S+)", line)
        rs = re.search(r" Reason=(.*?)(?: \[[^\]]*\])?$", line)
        if m and st:
            out[m.group(1)] = (st.group(1), rs.group(1).strip() if rs else "")
    return out


def resume_all(info: ClusterInfo, names: list[str]) -> None:
    subprocess.run(
        ["scontrol", "update", f"NodeName={','.join(names)}", "State=RESUME"],
        env=info.env(),
        capture_output=True,
        timeout=60,
    )


# ---- the controller
@dataclass
class ControllerProc:
    proc: subprocess.Popen[bytes]
    url: str
    secret: bytes
    workdir: Path
    db_path: Path
    tick_log: Path

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def db_bytes(self) -> int:
        return sum(
            p.stat().st_size
            for p in self.db_path.parent.glob(self.db_path.name + "*")
            if p.is_file()
        )

    def ticks(self, since: float = 0.0) -> list[tuple[str, float, float]]:
        out = []
        for line in self.tick_log.read_text().splitlines():
            name, start, dur = line.split()
            if float(start) >= since:
                out.append((name, float(start), float(dur)))
        return out


def start_controller(
    info: ClusterInfo, workdir: Path, settings: dict[str, str], backend: str = "cli"
) -> ControllerProc:
    workdir.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(32).encode()
    (workdir / "secret").write_bytes(secret)
    (workdir / "admin").write_text(secrets.token_hex(16))
    for f in ("secret", "admin"):
        (workdir / f).chmod(0o600)  # the controller refuses secrets others can read
    port = free_port()
    db = workdir / "babysitter.db"
    tick_log = workdir / "ticks.log"
    tick_log.write_text("")
    env = dict(
        info.env(),
        BABYSITTER_CONTROLLER__LISTEN=f"127.0.0.1:{port}",
        BABYSITTER_CONTROLLER__DATABASE_URL=f"sqlite:///{db}",
        BABYSITTER_CONTROLLER__CLUSTER_SECRET_FILE=str(workdir / "secret"),
        BABYSITTER_CONTROLLER__ADMIN_TOKEN_FILE=str(workdir / "admin"),
        BABYSITTER_SLURM__SLURM_CONF=info.slurm_conf,
        BABYSITTER_SLURM__BACKEND=backend,
        BENCH_TICK_LOG=str(tick_log),
        **settings,
    )
    if backend == "rest":
        env["BABYSITTER_SLURM__SLURMRESTD_URL"] = f"unix://{info.restd_socket}"
    env.pop("BABYSITTER_CONFIG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.bigcluster", "controller"],
        env=env,
        stdout=open(workdir / "controller.log", "ab"),  # noqa: SIM115 - handed to the child
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, 60, proc=proc, log=workdir / "controller.log")
    return ControllerProc(proc, url, secret, workdir, db, tick_log)


def controller_main() -> None:
    from babysitter.config import load_config
    from babysitter.controller.runtime import Controller

    log_path = os.environ["BENCH_TICK_LOG"]
    ctl = Controller(load_config())
    lock = threading.Lock()
    add_loop = ctl.add_loop

    def timed_add_loop(name: str, fn: Callable[[], None]) -> None:
        def timed() -> None:
            start = time.time()
            try:
                fn()
            finally:
                with lock, open(log_path, "a") as f:
                    f.write(f"{name} {start:.4f} {time.time() - start:.4f}\n")

        add_loop(name, timed)

    ctl.add_loop = timed_add_loop  # type: ignore[method-assign]
    ctl.serve()


# ---- reports
GPU_OK = [
    {
        "check": "gpu.memory",
        "component": f"gpu{i}",
        "severity": "ok",
        "code": "memory.ok",
        "message": f"GPU {i}: ok",
        "action": "none",
    }
    for i in range(8)
]
PCIE_WARN = {
    "check": "gpu.pcie",
    "component": "gpu2",
    "severity": "warning",
    "code": "pcie.width_degraded",
    "message": "GPU 2: PCIe x8 of x16",
    "action": "inspect",
}
DBE = {
    "check": "gpu.memory",
    "component": "gpu3",
    "severity": "critical",
    "code": "ecc.dbe.volatile",
    "message": "GPU 3: 1 volatile uncorrected ECC error",
    "action": "reset_gpu",
}


def report(node: str, extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    findings = [{**f, "observed_at": now} for f in GPU_OK + (extra or [])]
    return {
        "node": node,
        "report_id": str(uuid.uuid4()),
        "sent_at": now,
        "findings": findings,
        "metrics": {"spool_size": 0},
    }


@dataclass
class Load:
    """Open-loop ingest at `rate` reports/s in a thread: every node reports in turn, 1 % of
    reports carry a warning; latency counts from each report's scheduled send time."""

    ctl: ControllerProc
    nodes: list[str]
    rate: float = RATE
    lat: list[float] = field(default_factory=list)
    errors: int = 0
    sent: int = 0
    skip: set[str] = field(default_factory=set)  # nodes whose reports the benchmark sends
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    started: float = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        took = time.monotonic() - self.started
        s = summary(self.lat)
        s["p999"] = percentile(self.lat, 99.9)
        return {
            **s,
            "errors": self.errors,
            "offered": self.sent,
            "achieved_rate": len(self.lat) / took if took else 0.0,
        }

    def take(self) -> list[float]:
        """Latencies so far, and start a new sample (the achieved rate counts from here)."""
        out, self.lat = self.lat, []
        self.started = time.monotonic()
        return out

    def _templates(self, host: str, tokens: dict[str, str]) -> dict[tuple[str, bool], bytes]:
        """Encoded requests per node (clean and with a warning) with placeholders for the
        report id and the timestamps, filled in per request: encoding each report afresh (or
        re-encoding all 20,000 to keep timestamps recent, ~0.5 s with this loop blocked) would
        make the generator the bottleneck here."""
        out = {}
        for n in self.nodes:
            for warn in (False, True):
                body = json.dumps(report(n, [PCIE_WARN] if warn else None))
                body = re.sub(r'"report_id": "[^"]+"', f'"report_id": "{PLACEHOLDER}"', body)
                body = re.sub(
                    r'"(sent_at|observed_at)": "[^"]+"', rf'"\1": "{TS_PLACEHOLDER}"', body
                )
                data = body.encode()
                out[(n, warn)] = (
                    f"POST /api/v1/reports HTTP/1.1\r\nHost: {host}\r\n"
                    f"Authorization: Bearer {tokens[n]}\r\nX-Babysitter-Node: {n}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n".encode()
                    + data
                )
        return out

    async def _run(self) -> None:
        host, port = self.ctl.url.split("://", 1)[1].split(":")
        tokens = {n: node_token(self.ctl.secret, n) for n in self.nodes}
        templates = self._templates(host, tokens)
        placeholder, ts_placeholder = PLACEHOLDER.encode(), TS_PLACEHOLDER.encode()
        self.started = time.monotonic()
        start = time.perf_counter()
        counter = iter(range(1 << 62))

        async def worker() -> None:
            # one keep-alive connection each; a request waits for a free worker, and its
            # latency counts from its scheduled time (no coordinated omission)
            reader, writer = await asyncio.open_connection(host, int(port))
            while not self._stop.is_set():
                i = next(counter)
                node = self.nodes[i % len(self.nodes)]
                scheduled = start + i / self.rate
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if node in self.skip:
                    continue
                # same length as the placeholders: Content-Length stays right
                now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00").encode()
                req = (
                    templates[(node, i % 100 == 7)]
                    .replace(placeholder, str(uuid.uuid4()).encode(), 1)
                    .replace(ts_placeholder, now)
                )
                self.sent += 1
                try:
                    writer.write(req)
                    await writer.drain()
                    head = await reader.readuntil(b"\r\n\r\n")
                    status = int(head.split(b" ", 2)[1])
                    m = re.search(rb"(?i)content-length: *(\d+)", head)
                    if m:
                        await reader.readexactly(int(m.group(1)))
                except (OSError, asyncio.IncompleteReadError):
                    self.errors += 1
                    reader, writer = await asyncio.open_connection(host, int(port))
                    continue
                if status in (200, 202):
                    self.lat.append(time.perf_counter() - scheduled)
                else:
                    self.errors += 1
            writer.close()

        await asyncio.gather(*(worker() for _ in range(POOL)))


def tick_stats(ticks: list[tuple[str, float, float]], name: str = "remediation") -> dict[str, Any]:
    starts = [s for n, s, _ in ticks if n == name]
    durs = [d for n, _, d in ticks if n == name]
    periods = [b - a for a, b in itertools.pairwise(starts)]
    return {
        "ticks": len(starts),
        "period": summary(periods),
        "duration": summary(durs),
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["controller"]:
        controller_main()
    else:
        sys.exit("usage: python -m bench.bigcluster controller")
