"""The cockpit at 10,000 nodes (issue 44): what the status page and /metrics cost the controller
and what they cost ingest.

The real controller (its defaults, SQLite) in a subprocess, with an in-memory Slurm stand-in of
the fleet's size (bench/slurm_standin.py; 8 partitions), one real report per node from the
open-loop generator of bench/bigcluster.py (1 % of reports carry a warning: suspect nodes) and
UNHEALTHY nodes reporting a double-bit ECC error. The bench's readers all come from 127.0.0.1,
so the per-client rate limits are raised for the run (they are tested in tests/test_readers.py).

1. At 10,000 nodes, ingest at 2,000 reports/s in three windows of the same run: no readers,
   then TABS open status tabs (GET /ui every TAB_PERIOD_S each, conditional with If-None-Match
   where the page gives an ETag) plus SCRAPERS Prometheus scrapers (GET /metrics every
   SCRAPE_PERIOD_S), then no readers again. The readers run in a process of their own so the
   generator's latencies are the controller's. Figure: ingest p99 with readers / p99 without
   (both windows without, together).
2. At 1,000 and 10,000 nodes, ingest stopped: /ui (full and conditional) and /metrics median
   latency and bytes, sequentially; and the controller's CPU per /metrics scrape (its CPU over
   SCRAPES back-to-back scrapes less its CPU over the same time idle, per scrape).

Run: python -m bench.cockpit [--quick] [--results-dir DIR]. --quick: tiny fleets and windows of
seconds (tests/test_bench_cockpit.py runs it so the code cannot rot); its figures mean nothing."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from babysitter.controller.api.auth import node_token
from bench.bigcluster import DBE, POOL, ControllerProc, Load, free_port, report
from bench.common import figure, percentile, summary, wait_ready, wait_until, write_result

CLK_TCK = os.sysconf("SC_CLK_TCK")
PARTITIONS = 8
UNHEALTHY = 20


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]  # fleets measured for latency, bytes and CPU per scrape
    big: int  # the fleet the ingest windows run at
    rate: float  # reports/s at `big`
    window_s: float  # each ingest window
    tabs: int
    tab_period_s: float
    scrapers: int
    scrape_period_s: float
    samples: int  # sequential requests per latency figure
    scrapes: int  # back-to-back scrapes for the CPU figure


FULL = Plan((1_000, 10_000), 10_000, 2000.0, 60.0, 10, 5.0, 2, 5.0, 30, 200)
QUICK = Plan((60, 200), 200, 100.0, 2.0, 2, 1.0, 1, 1.0, 3, 10)


def node_names(n: int) -> list[str]:
    return [f"node{i:05d}" for i in range(n)]


# ---- the controller (`python -m bench.cockpit controller`)
def controller_main() -> None:
    """The real Controller, its Slurm client the in-memory stand-in with the bench's fleet."""
    import babysitter.slurm.factory as factory
    from babysitter.config import load_config
    from babysitter.controller.runtime import Controller
    from bench.slurm_standin import InMemorySlurm

    names = node_names(int(os.environ["BENCH_COCKPIT_NODES"]))
    slurm = InMemorySlurm(names, {n: f"p{i % PARTITIONS}" for i, n in enumerate(names)})
    factory.make_client = lambda cfg: slurm  # type: ignore[assignment]
    Controller(load_config()).serve()


def start_controller(workdir: Path, nodes: int) -> tuple[ControllerProc, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(32).encode()
    read = secrets.token_hex(16)
    (workdir / "secret").write_bytes(secret)
    (workdir / "admin").write_text(secrets.token_hex(16))
    (workdir / "read").write_text(read)
    for f in ("secret", "admin", "read"):
        (workdir / f).chmod(0o600)  # the controller refuses secrets others can read
    port = free_port()
    db = workdir / "babysitter.db"
    tick_log = workdir / "ticks.log"
    tick_log.write_text("")
    env = dict(
        os.environ,
        BENCH_COCKPIT_NODES=str(nodes),
        BABYSITTER_CONTROLLER__LISTEN=f"127.0.0.1:{port}",
        BABYSITTER_CONTROLLER__DATABASE_URL=f"sqlite:///{db}",
        BABYSITTER_CONTROLLER__CLUSTER_SECRET_FILE=str(workdir / "secret"),
        BABYSITTER_CONTROLLER__ADMIN_TOKEN_FILE=str(workdir / "admin"),
        BABYSITTER_CONTROLLER__READ_TOKEN_FILE=str(workdir / "read"),
        # every reader of the bench has the address 127.0.0.1
        BABYSITTER_CONTROLLER__UI_REQUESTS_PER_S="1000",
        BABYSITTER_CONTROLLER__UI_BURST="1000",
        BABYSITTER_CONTROLLER__METRICS_REQUESTS_PER_S="1000",
        BABYSITTER_CONTROLLER__METRICS_BURST="1000",
        BABYSITTER_SLURM__SLURM_CONF="/nonexistent/slurm.conf",
    )
    env.pop("BABYSITTER_CONFIG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.cockpit", "controller"],
        env=env,
        stdout=open(workdir / "controller.log", "ab"),  # noqa: SIM115 - handed to the child
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, 120, proc=proc, log=workdir / "controller.log")
    return ControllerProc(proc, url, secret, workdir, db, tick_log), read


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def seed(ctl: ControllerProc, read: str, names: list[str], rate: float) -> Load:
    """Every node reports (open loop, going on until the returned Load is stopped); the
    UNHEALTHY first nodes report a DBE instead. Returns once /metrics counts every node."""
    bad = names[:UNHEALTHY]
    load = Load(ctl, names, rate=rate, skip=set(bad))
    load.start()
    with httpx.Client(base_url=ctl.url, timeout=30) as c:
        for n in bad:
            r = c.post(
                "/api/v1/reports",
                json=report(n, [DBE]),
                headers={
                    "Authorization": f"Bearer {node_token(ctl.secret, n)}",
                    "X-Babysitter-Node": n,
                },
            )
            r.raise_for_status()

        def counted() -> bool:
            text = c.get("/metrics", headers={"Authorization": f"Bearer {read}"}).text
            total = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("babysitter_nodes{")
            )
            return total >= len(names)

        wait_until(counted, 60 + 2 * len(names) / rate, poll=0.5, what="every node on /metrics")
    return load


# ---- readers (`python -m bench.cockpit readers URL TOKEN SECONDS TABS TAB_S SCRAPERS SCRAPE_S`)
def readers_main(argv: list[str]) -> None:
    """Open tabs and scrapers for `seconds`, in this process; prints what they saw (JSON)."""
    url, token = argv[0], argv[1]
    seconds, tabs, tab_s, scrapers, scrape_s = (
        float(argv[2]),
        int(argv[3]),
        float(argv[4]),
        int(argv[5]),
        float(argv[6]),
    )
    out: dict[str, list[dict[str, Any]]] = {"ui": [], "metrics": []}
    lock = threading.Lock()
    # started and imported before the window: a Python start is a CPU burst of its own
    print("ready", flush=True)
    sys.stdin.readline()
    stop = time.monotonic() + seconds

    def reader(kind: str, path: str, period: float, offset: float) -> None:
        etag = None
        # idle connections are dropped before the controller's keep-alive (5 s) closes them
        limits = httpx.Limits(keepalive_expiry=1.0)
        with httpx.Client(base_url=url, timeout=60, limits=limits) as c:
            nxt = time.monotonic() + offset
            while nxt < stop:
                time.sleep(max(0.0, nxt - time.monotonic()))
                headers = {"Authorization": f"Bearer {token}"}
                if etag:
                    headers["If-None-Match"] = etag
                t = time.perf_counter()
                try:
                    r = c.get(path, headers=headers)
                except httpx.TransportError:
                    status, size = 0, 0  # counted, never dropped: 0 is no answer
                else:
                    status, size = r.status_code, len(r.content)
                    etag = r.headers.get("etag") or etag
                took = time.perf_counter() - t
                with lock:
                    out[kind].append({"status": status, "s": took, "bytes": size})
                nxt += period

    threads = [
        threading.Thread(target=reader, args=("ui", "/ui", tab_s, tab_s * i / max(1, tabs)))
        for i in range(tabs)
    ] + [
        threading.Thread(
            target=reader, args=("metrics", "/metrics", scrape_s, scrape_s * i / max(1, scrapers))
        )
        for i in range(scrapers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(out))


def run_readers(ctl: ControllerProc, read: str, plan: Plan, seconds: float) -> subprocess.Popen:
    args = [ctl.url, read, seconds, plan.tabs, plan.tab_period_s, plan.scrapers]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.cockpit",
            "readers",
            *map(str, args),
            str(plan.scrape_period_s),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


# ---- the measurements
def ingest_windows(ctl: ControllerProc, read: str, load: Load, plan: Plan) -> dict[str, Any]:
    """No readers, readers, no readers: the generator's latencies of each window. The page
    and /metrics are loaded once before (an open controller has served them before: the
    first render's one-off work is not a reader's steady cost), and the readers' process is
    started before its window."""
    with httpx.Client(base_url=ctl.url, timeout=60) as c:
        for path in ("/ui", "/metrics"):
            c.get(path, headers={"Authorization": f"Bearer {read}"}).raise_for_status()
    load.take()  # the seeding's latencies are not a window's
    time.sleep(plan.window_s)
    readers = run_readers(ctl, read, plan, plan.window_s)
    assert readers.stdin is not None and readers.stdout is not None
    if readers.stdout.readline().strip() != "ready":
        raise RuntimeError("the readers' process did not start")
    quiet1 = load.take()
    rate1 = len(quiet1) / plan.window_s
    readers.stdin.write("go\n")
    readers.stdin.flush()
    out, _ = readers.communicate(timeout=plan.window_s + 300)
    busy = load.take()
    rate_busy = len(busy) / plan.window_s
    time.sleep(plan.window_s)
    quiet2 = load.take()
    seen = json.loads(out)
    quiet = quiet1 + quiet2
    return {
        "quiet": {**summary(quiet), "p99": percentile(quiet, 99)},
        "readers": {**summary(busy), "p99": percentile(busy, 99)},
        "offered_rate": plan.rate,
        "answered_rate": {"quiet_first": rate1, "readers": rate_busy},
        "quiet_first": summary(quiet1),
        "quiet_second": summary(quiet2),
        "reader_requests": {
            kind: {
                "n": len(rs),
                "statuses": sorted({r["status"] for r in rs}),
                "median_s": statistics.median([r["s"] for r in rs]) if rs else None,
                "max_s": max((r["s"] for r in rs), default=None),
                "median_bytes": statistics.median([r["bytes"] for r in rs]) if rs else None,
            }
            for kind, rs in seen.items()
        },
        "generator_errors": load.errors,
    }


def sequential(c: httpx.Client, path: str, n: int, conditional: bool = False) -> dict[str, Any]:
    """`n` requests one after the other: median latency and bytes (statuses seen)."""
    lat, size, statuses = [], [], set()
    etag = None
    if conditional:
        etag = c.get(path).headers.get("etag")
    for _ in range(n):
        headers = {"If-None-Match": etag} if etag else {}
        t = time.perf_counter()
        r = c.get(path, headers=headers)
        lat.append(time.perf_counter() - t)
        size.append(len(r.content))
        statuses.add(r.status_code)
    return {
        "median_ms": 1000 * statistics.median(lat),
        "max_ms": 1000 * max(lat),
        "median_bytes": statistics.median(size),
        "statuses": sorted(statuses),
        "etag": etag is not None,
    }


def reads_at(ctl: ControllerProc, read: str, plan: Plan) -> dict[str, Any]:
    """Ingest stopped: /ui and /metrics latency and bytes, and CPU per scrape."""
    pid = ctl.proc.pid
    with httpx.Client(
        base_url=ctl.url, timeout=60, headers={"Authorization": f"Bearer {read}"}
    ) as c:
        out = {
            "ui": sequential(c, "/ui", plan.samples),
            "ui_conditional": sequential(c, "/ui", plan.samples, conditional=True),
            "metrics": sequential(c, "/metrics", plan.samples),
        }
        # the controller's own CPU while idle (its loops, the published snapshots) ...
        t0, c0 = time.monotonic(), cpu_s(pid)
        for _ in range(plan.scrapes):
            c.get("/metrics")
        busy_s, busy_cpu = time.monotonic() - t0, cpu_s(pid) - c0
        # ... over the same time with no request, right after
        t1, c1 = time.monotonic(), cpu_s(pid)
        time.sleep(busy_s)
        idle_cpu = (cpu_s(pid) - c1) * busy_s / (time.monotonic() - t1)
    out["metrics_cpu_ms_per_scrape"] = 1000 * max(0.0, busy_cpu - idle_cpu) / plan.scrapes
    out["idle_cores"] = idle_cpu / busy_s if busy_s else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cockpit")
    ap.add_argument("--quick", action="store_true", help="tiny fleets, seconds (a smoke test)")
    ap.add_argument("--results-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else FULL
    # a machine that cannot take the design rate (a shared one) measures the same at a lower
    # one: BENCH_COCKPIT_RATE reports/s at the big fleet, BENCH_COCKPIT_WINDOW_S per window
    plan = replace(
        plan,
        rate=float(os.environ.get("BENCH_COCKPIT_RATE", plan.rate)),
        window_s=float(os.environ.get("BENCH_COCKPIT_WINDOW_S", plan.window_s)),
    )
    details: dict[str, Any] = {"plan": plan.__dict__, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="bench-cockpit-") as tmp:
        for n in plan.sizes:
            names = node_names(n)
            ctl, read = start_controller(Path(tmp) / str(n), n)
            try:
                # 5 s between a node's reports, as at the design rate; no slower than one
                # report per generator connection every 2.5 s (the controller closes a
                # keep-alive connection idle for 5 s)
                rate = plan.rate if n == plan.big else max(POOL / 2.5, plan.rate * n / plan.big)
                load = seed(ctl, read, names, rate)
                if n == plan.big:
                    details["ingest"] = ingest_windows(ctl, read, load, plan)
                load.stop()
                details["sizes"][str(n)] = reads_at(ctl, read, plan)
            finally:
                ctl.stop()
    figures = _figures(plan, details)
    write_result(
        "cockpit" if not args.quick else "cockpit_quick",
        figures,
        details,
        settings={"quick": args.quick, "rate": plan.rate, "window_s": plan.window_s},
        results_dir=args.results_dir,
    )
    for f in figures:
        print(f"{f['metric']}: {f['value']:.4g} {f['unit']}")
    return 0


def _figures(plan: Plan, d: dict[str, Any]) -> list[dict[str, Any]]:
    small, big = (str(n) for n in plan.sizes)
    s, b = d["sizes"][small], d["sizes"][big]
    ing = d["ingest"]
    readers = f"{plan.tabs} tabs + {plan.scrapers} scrapers"
    ratio = ing["readers"]["p99"] / ing["quiet"]["p99"] if ing["quiet"]["p99"] else float("nan")
    cpu_ratio = (
        b["metrics_cpu_ms_per_scrape"] / s["metrics_cpu_ms_per_scrape"]
        if s["metrics_cpu_ms_per_scrape"]
        else float("nan")
    )
    fl = [
        figure(
            f"ingest at {plan.rate:g}/s p50, {big} nodes, no readers",
            1000 * ing["quiet"]["p50"],
            "ms",
        ),
        figure(
            f"ingest at {plan.rate:g}/s p99, {big} nodes, no readers",
            1000 * ing["quiet"]["p99"],
            "ms",
        ),
        figure(
            f"ingest at {plan.rate:g}/s p50, {big} nodes, {readers}",
            1000 * ing["readers"]["p50"],
            "ms",
        ),
        figure(
            f"ingest at {plan.rate:g}/s p99, {big} nodes, {readers}",
            1000 * ing["readers"]["p99"],
            "ms",
        ),
        figure(
            "ingest p99 with readers / without (same run)",
            ratio,
            "x",
            goal="<= 1.2",
            met=ratio <= 1.2,
        ),
    ]
    for n, r in ((small, s), (big, b)):
        fl += [
            figure(f"/ui median, {n} nodes", r["ui"]["median_ms"], "ms"),
            figure(f"/ui bytes, {n} nodes", r["ui"]["median_bytes"], "B"),
            figure(
                f"/ui conditional refresh bytes, {n} nodes",
                r["ui_conditional"]["median_bytes"],
                "B",
                etag=r["ui_conditional"]["etag"],
            ),
            figure(f"/metrics median, {n} nodes", r["metrics"]["median_ms"], "ms"),
            figure(f"/metrics bytes, {n} nodes", r["metrics"]["median_bytes"], "B"),
            figure(
                f"/metrics controller CPU per scrape, {n} nodes",
                r["metrics_cpu_ms_per_scrape"],
                "ms",
            ),
        ]
    fl.append(
        figure(
            f"/metrics CPU per scrape, {big} / {small} nodes",
            cpu_ratio,
            "x",
            goal="flat (<= 1.5)",
            met=cpu_ratio <= 1.5,
        )
    )
    return fl


if __name__ == "__main__":
    if sys.argv[1:2] == ["controller"]:
        controller_main()
    elif sys.argv[1:2] == ["readers"]:
        readers_main(sys.argv[2:])
    else:
        sys.exit(main(sys.argv[1:]))
