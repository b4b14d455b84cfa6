"""Controller ingest: simulated agents of 10,000 nodes against a controller subprocess on SQLite
and on Postgres, in two phases:

1. latency at the design load: open loop, 2,000 reports/s offered (10k nodes at a 5 s interval)
   whether or not earlier ones have been answered, latency measured from each report's scheduled
   send time (so a stalled server cannot hide its queue: no coordinated omission);
2. throughput at saturation: closed loop, CONCURRENCY keep-alive connections sending as fast as
   answers come back.

Beside them, in the same run, the raw insert rate of the same rows straight into the same
schema with SQLAlchemy (report, findings and node-state rows; no HTTP, no validation): one
transaction per report (what each POST means without the controller's batching; the goal's
baseline) and 500 reports per transaction (the database's ceiling, reported for scale).
Run: python -m bench.ingest"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from babysitter.controller.api.auth import node_token
from babysitter.controller.api.node_state import NODE_STATE_UPDATE
from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store
from bench.common import figure, missing, summary, wait_ready, write_result

NODES = 10_000
DURATION_S = float(os.environ.get("BENCH_INGEST_S", "10"))
DESIGN_RATE = 2000.0  # reports/s: 10k nodes at a 5 s interval
CONCURRENCY = 64  # saturation phase
ROUNDS = 3  # saturation rounds, each followed by a raw-insert baseline round
OPEN_LOOP_POOL = 256  # connections the open-loop phase may have in flight
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


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> int:
    """Send one pre-encoded request on a keep-alive connection, read the answer, return its
    status. A minimal client on purpose: httpx spends ~3 ms of CPU per request, which on a
    2-core machine would measure the client instead of the controller."""
    writer.write(req)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    m = re.search(rb"(?i)content-length: *(\d+)", head)
    if m:
        await reader.readexactly(int(m.group(1)))
    return status


async def _conn_worker(
    host: str,
    port: int,
    requests: list[bytes],
    deadline: float,
    lat: list[float],
    statuses: list[int],
) -> None:
    """Closed loop: one connection, the next request as soon as the last is answered."""
    reader, writer = await asyncio.open_connection(host, port)
    i = 0
    try:
        while time.monotonic() < deadline and i < len(requests):
            t = time.perf_counter()
            status = await _exchange(reader, writer, requests[i])
            if status in (200, 202):
                lat.append(time.perf_counter() - t)
            statuses.append(status)
            i += 1
    finally:
        writer.close()


async def open_loop(
    url: str, requests: list[bytes], rate: float, duration: float
) -> tuple[list[float], int, float]:
    """Offer `rate` reports/s for `duration` seconds on a pool of keep-alive connections.
    Returns latencies (from the scheduled send time), errors and the achieved rate."""
    host, port = url.split("://", 1)[1].split(":")
    pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    conns = [await asyncio.open_connection(host, int(port)) for _ in range(OPEN_LOOP_POOL)]
    for c in conns:
        pool.put_nowait(c)
    lat: list[float] = []
    errors = 0

    async def one(req: bytes, scheduled: float) -> None:
        nonlocal errors
        reader, writer = await pool.get()
        try:
            status = await _exchange(reader, writer, req)
        except (OSError, asyncio.IncompleteReadError):
            errors += 1
            return
        pool.put_nowait((reader, writer))
        if status in (200, 202):
            lat.append(time.perf_counter() - scheduled)
        else:
            errors += 1

    total = min(len(requests), int(rate * duration))
    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    i = 0
    while i < total:
        now = time.perf_counter()
        while i < total and start + i / rate <= now:
            task = asyncio.create_task(one(requests[i], start + i / rate))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
    await asyncio.gather(*tasks)
    took = time.perf_counter() - start
    for _, writer in conns:
        writer.close()
    return lat, errors, len(lat) / took


def encode_requests(url: str, secret: bytes, n: int, offset: int) -> list[bytes]:
    host = url.split("://", 1)[1]
    out = []
    for k in range(n):
        node = f"n{(offset + k) % NODES:05d}"
        body = json.dumps(report_body(node)).encode()
        out.append(
            f"POST /api/v1/reports HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {node_token(secret, node)}\r\n"
            f"X-Babysitter-Node: {node}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    return out


async def load(url: str, secret: bytes, duration: float, offset: int = 0) -> list[float]:
    """Closed loop at saturation; returns the latencies of the answered reports."""
    host, port = url.split("://", 1)[1].split(":")
    # enough for 6,000 reports/s (a connection that runs out stops early, which would show as
    # a lower rate, never a higher one)
    per_conn = int(duration * 6000 / CONCURRENCY) + 1
    reqs = [
        encode_requests(url, secret, per_conn, offset + w * per_conn) for w in range(CONCURRENCY)
    ]
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
    for f in ("secret", "admin"):
        (workdir / f).chmod(0o600)  # the controller refuses secrets others can read
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
    wait_ready(url, 60, proc=p)
    return p, url, secret


def raw_insert_rate(db_url: str, per_transaction: int, n_reports: int) -> float:
    """Reports/s for writing the same rows the controller writes for a report straight into the
    schema: the report row, its non-ok finding rows and its node's state row (an UPDATE; node
    rows exist beforehand, as they do on a running controller). No HTTP, no validation, no
    dedup lookup, no batching beyond `per_transaction` reports per transaction."""
    store = Store(db_url)
    store.upgrade()
    bodies = [report_body(f"n{i % NODES:05d}") for i in range(n_reports)]
    now = datetime.now(UTC)
    with store.engine.begin() as c:
        c.execute(
            m.nodes.insert(),
            [
                {"name": n, "first_seen_at": now, "open_findings": []}
                for n in sorted({b["node"] for b in bodies})
            ],
        )
    t = time.perf_counter()
    for k in range(0, n_reports, per_transaction):
        chunk = bodies[k : k + per_transaction]
        problems = [[f for f in b["findings"] if f["severity"] != "ok"] for b in chunk]
        with store.engine.begin() as c:
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
                    for b, probs in zip(chunk, problems, strict=True)
                    for f in probs
                ],
            )
            c.execute(
                NODE_STATE_UPDATE,
                [
                    {
                        "b_name": b["node"],
                        "open_findings": probs,
                        "consecutive_clean": 0,
                        "worst_severity": "warning",
                        "last_report_at": now,
                        "last_report_id": b["report_id"],
                        "last_sent_at": now,
                        "metrics": b["metrics"],
                    }
                    for b, probs in zip(chunk, problems, strict=True)
                ],
            )
    took = time.perf_counter() - t
    store.close()
    return n_reports / took


PG_WHY: list[str] = []  # why Postgres could not be used this run


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
        PG_WHY.append(f"postgres unavailable: {exc}"[:300])
        return None


def drop_pg_database(url: str) -> None:
    try:
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except Exception as exc:
        print(f"could not drop {url}: {exc}")


def bench_one(label: str, make_url: Any) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-ingest-{label}-"))
    urls: dict[str, str | None] = {}
    try:
        keys = ["ctl", "rawb"] + [f"raw1_{i}" for i in range(ROUNDS)]
        urls = {k: make_url(work, k) for k in keys}
        if None in urls.values():
            # the rows are shown as MISSING (with the reason), not silently left out
            why = PG_WHY[-1] if PG_WHY else f"{label} database unavailable"
            return [
                missing(
                    f"ingest latency at {DESIGN_RATE:.0f} reports/s offered "
                    f"(10k nodes / 5 s), {label}",
                    "s",
                    why,
                ),
                missing(
                    f"ingest reports/s at saturation ({CONCURRENCY} connections), {label}",
                    "reports/s",
                    why,
                ),
            ]
        # per-report transactions are fsync-bound on Postgres: fewer reports keep it short
        n_raw1 = 2000 if label == "sqlite" else 600
        p, url, secret = run_controller(urls["ctl"], work)
        try:
            offered = encode_requests(url, secret, int(DESIGN_RATE * DURATION_S), 0)
            open_lat, open_errors, achieved = asyncio.run(
                open_loop(url, offered, DESIGN_RATE, DURATION_S)
            )
            del offered
            # saturation and its baseline interleaved, so a noisy neighbour hits both alike
            lat, rates, raw1s = [], [], []
            for i in range(ROUNDS):
                part = asyncio.run(
                    load(url, secret, DURATION_S / ROUNDS, offset=NODES // 2 + i * 1000)
                )
                lat += part
                rates.append(len(part) / (DURATION_S / ROUNDS))
                raw1s.append(raw_insert_rate(urls[f"raw1_{i}"], 1, n_raw1))
        finally:
            p.terminate()
            p.wait(timeout=30)
        rate, raw1 = statistics.median(rates), statistics.median(raw1s)
        rawb = raw_insert_rate(urls["rawb"], 500, 5000)
        s_open, s_sat = summary(open_lat), summary(lat)
        goal = 2000 if label == "sqlite" else 1500
        return [
            figure(
                f"ingest latency at {DESIGN_RATE:.0f} reports/s offered (10k nodes / 5 s), {label}",
                s_open.get("p50", float("nan")),
                "s",
                goal="p99 <= 0.1 s, all answered",
                met=s_open.get("p99", 1) <= 0.1
                and open_errors == 0
                and achieved >= 0.97 * DESIGN_RATE,
                achieved_rate=round(achieved, 1),
                errors=open_errors,
                **s_open,
            ),
            figure(
                f"ingest reports/s at saturation ({CONCURRENCY} connections), {label}",
                rate,
                "reports/s",
                baseline="raw insert of the same rows, one transaction per report",
                baseline_value=raw1,
                goal=f">= {goal}/s and >= 50 % of raw",
                met=rate >= goal and rate >= 0.5 * raw1,
                n=len(lat),
                rounds=[round(r, 1) for r in rates],
                baseline_rounds=[round(r, 1) for r in raw1s],
                p50=s_sat.get("p50"),
                p99=s_sat.get("p99"),
            ),
            figure(
                f"ingest reports/s at saturation against the batched ceiling, {label}",
                rate,
                "reports/s",
                baseline="raw insert of the same rows, 500 reports per transaction",
                baseline_value=rawb,
                n=len(lat),
            ),
        ]
    finally:
        for u in urls.values():
            if u and u.startswith("postgresql"):
                drop_pg_database(u)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    t0 = time.monotonic()
    figs = bench_one("sqlite", lambda w, k: f"sqlite:///{w / (k + '.db')}")
    figs += bench_one("postgres", lambda w, k: pg_database())
    settings = {
        "nodes": NODES,
        "concurrency": CONCURRENCY,
        "design_rate": DESIGN_RATE,
        "open_loop_pool": OPEN_LOOP_POOL,
        "duration_s": DURATION_S,
        "rounds": ROUNDS,
        "findings_per_report": 9,
        "postgres": PG_ADMIN.rsplit("@", 1)[-1],
    }
    write_result(
        "ingest", figs, settings, settings=settings, duration_s=round(time.monotonic() - t0, 1)
    )
    for f in figs:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
