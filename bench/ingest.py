"""Controller ingest: simulated agents (async httpx, many nodes) against a controller
subprocess on SQLite and on Postgres: reports/s and p50/p99 latency, beside the raw insert
rate of the same rows (SQLAlchemy executemany into the same schema) measured in the same run.
Run: python -m bench.ingest"""

from __future__ import annotations

import asyncio
import os
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
DURATION_S = 12.0
CONCURRENCY = 64
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


async def load(url: str, secret: bytes, duration: float) -> list[float]:
    lat: list[float] = []
    tokens = {f"n{i:05d}": node_token(secret, f"n{i:05d}") for i in range(NODES)}
    names = list(tokens)
    deadline = time.monotonic() + duration

    async def worker(w: int, client: httpx.AsyncClient) -> None:
        i = w
        while time.monotonic() < deadline:
            node = names[i % NODES]
            i += CONCURRENCY
            body = report_body(node)
            t = time.perf_counter()
            r = await client.post(
                f"{url}/api/v1/reports",
                json=body,
                headers={"Authorization": f"Bearer {tokens[node]}"},
            )
            if r.status_code in (200, 202):
                lat.append(time.perf_counter() - t)

    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        await asyncio.gather(*(worker(w, client) for w in range(CONCURRENCY)))
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
