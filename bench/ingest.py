"""Controller ingest: simulated agents (async httpx, many nodes) against a controller
subprocess on SQLite and on Postgres: reports/s and p50/p99 latency, beside the raw insert
rate of the same rows (SQLAlchemy executemany into the same schema) measured in the same run.
Run: python -m bench.ingest"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from babysitter.controller import models as m
from babysitter.controller.auth import node_token
from babysitter.controller.store import Store
from bench.common import figure, summary, write_result

NODES = 10_000
DURATION_S = float(os.environ.get("BENCH_INGEST_S", "12"))
CONCURRENCY = 32
PG_ADMIN = os.environ.get("BABYSITTER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def report_body(node: str) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    findings = [
        {
            "check": "gpu.memory",
            "component": f"gpu{i}",
            "severity": "ok",
            "code": "memory.ok",
            "message": f"GPU {i}: ok",
            "action": "none",
            "observed_at": now,
            "details": {"index": i},
        }
        for i in range(8)
    ]
    findings.append(
        {
            "check": "gpu.pcie",
            "component": "gpu2",
            "severity": "warning",
            "code": "pcie.width_degraded",
            "message": "GPU 2: PCIe x8 of x16",
            "action": "inspect",
            "observed_at": now,
            "details": {"width": 8},
        }
    )
    return {
        "node": node,
        "report_id": str(uuid.uuid4()),
        "sent_at": now,
        "findings": findings,
        "metrics": {"spool_size": 0},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _conn_worker(
    host: str,
    port: int,
    requests: list[bytes],
    deadline: float,
    lat: list[float],
    statuses: list[int],
) -> None:
    """One keep-alive HTTP/1.1 connection sending pre-encoded requests. A minimal client on
    purpose: httpx spends ~3 ms of CPU per request, which on a 2-core machine would measure
    the client instead of the controller."""
    reader, writer = await asyncio.open_connection(host, port)
    i = 0
    try:
        while time.monotonic() < deadline and i < len(requests):
            t = time.perf_counter()
            writer.write(requests[i])
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            m = re.search(rb"(?i)content-length: *(\d+)", head)
            if m:
                await reader.readexactly(int(m.group(1)))
            if status in (200, 202):
                lat.append(time.perf_counter() - t)
            statuses.append(status)
            i += 1
    finally:
        writer.close()


def encode_requests(url: str, secret: bytes, n: int, offset: int) -> list[bytes]:
    host = url.split("://", 1)[1]
    out = []
    for k in range(n):
        node = f"n{(offset + k) % NODES:05d}"
        body = json.dumps(report_body(node)).encode()
        out.append(
            f"POST /api/v1/reports HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {node_token(secret, node)}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    return out


async def load(url: str, secret: bytes, duration: float) -> list[float]:
    host, port = url.split("://", 1)[1].split(":")
    per_conn = 4000
    reqs = [encode_requests(url, secret, per_conn, w * per_conn) for w in range(CONCURRENCY)]
    lat: list[float] = []
    statuses: list[int] = []
    deadline = time.monotonic() + duration
    await asyncio.gather(
        *(
            _conn_worker(host, int(port), reqs[w], deadline, lat, statuses)
            for w in range(CONCURRENCY)
        )
    )
    return lat


def run_controller(db_url: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str, bytes]:
    secret = secrets.token_hex(32).encode()
    (workdir / "secret").write_bytes(secret)
    (workdir / "admin").write_text(secrets.token_hex(16))
    port = free_port()
    env = dict(
        os.environ,
        BABYSITTER_CONTROLLER__LISTEN=f"127.0.0.1:{port}",
        BABYSITTER_CONTROLLER__DATABASE_URL=db_url,
        BABYSITTER_CONTROLLER__CLUSTER_SECRET_FILE=str(workdir / "secret"),
        BABYSITTER_CONTROLLER__ADMIN_TOKEN_FILE=str(workdir / "admin"),
        BABYSITTER_SLURM__SLURM_CONF="/nonexistent/slurm.conf",
    )
    env.pop("BABYSITTER_CONFIG", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "babysitter.cli.main", "controller"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return p, url, secret


def raw_insert_rate(db_url: str, n_reports: int = 5000) -> float:
    """Reports/s for inserting the same rows straight into the schema (no HTTP, no dedup)."""
    store = Store(db_url)
    store.upgrade()
    bodies = [report_body(f"n{i % NODES:05d}") for i in range(n_reports)]
    now = datetime.now(UTC)
    t = time.perf_counter()
    with store.engine.begin() as c:
        for k in range(0, n_reports, 500):
            chunk = bodies[k : k + 500]
            c.execute(
                m.reports.insert(),
                [
                    {
                        "report_id": b["report_id"],
                        "node": b["node"],
                        "kind": "full",
                        "sent_at": now,
                        "received_at": now,
                        "n_findings": 9,
                        "worst_severity": "warning",
                        "metrics": b["metrics"],
                    }
                    for b in chunk
                ],
            )
            c.execute(
                m.findings.insert(),
                [
                    {
                        "report_id": b["report_id"],
                        "node": b["node"],
                        "check": f["check"],
                        "component": f["component"],
                        "severity": f["severity"],
                        "code": f["code"],
                        "message": f["message"],
                        "action": f["action"],
                        "observed_at": now,
                        "details": f["details"],
                    }
                    for b in chunk
                    for f in b["findings"]
                    if f["severity"] != "ok"
                ],
            )
    took = time.perf_counter() - t
    store.close()
    return n_reports / took


def pg_database() -> str | None:
    try:
        import psycopg

        name = f"bs_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        host = PG_ADMIN.split("://", 1)[1].rsplit("/", 1)[0]
        return f"postgresql+psycopg://{host}/{name}"
    except Exception as exc:
        print(f"postgres unavailable: {exc}")
        return None


def bench_one(label: str, make_url: Any) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-ingest-{label}-"))
    try:
        url_ctl = make_url(work, "ctl")
        url_raw = make_url(work, "raw")
        if url_ctl is None or url_raw is None:
            return []
        p, url, secret = run_controller(url_ctl, work)
        try:
            lat = asyncio.run(load(url, secret, DURATION_S))
        finally:
            p.terminate()
            p.wait(timeout=30)
        rate = len(lat) / DURATION_S
        raw = raw_insert_rate(url_raw)
        s = summary(lat)
        goal = 2000 if label == "sqlite" else 1500
        return [
            figure(
                f"ingest reports/s, {label}",
                rate,
                "reports/s",
                baseline="raw insert of the same rows",
                baseline_value=raw,
                goal=f">= {goal}/s and >= 50 % of raw",
                met=rate >= goal and rate >= 0.5 * raw,
                n=len(lat),
            ),
            figure(
                f"ingest latency, {label}",
                s.get("p50", float("nan")),
                "s",
                goal="p99 <= 0.1 s",
                met=s.get("p99", 1) <= 0.1,
                **s,
            ),
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    t0 = time.monotonic()
    figs = bench_one("sqlite", lambda w, k: f"sqlite:///{w / (k + '.db')}")
    figs += bench_one("postgres", lambda w, k: pg_database())
    write_result(
        "ingest",
        figs,
        {
            "nodes": NODES,
            "concurrency": CONCURRENCY,
            "duration_s": DURATION_S,
            "findings_per_report": 9,
        },
        duration_s=round(time.monotonic() - t0, 1),
    )
    for f in figs:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
