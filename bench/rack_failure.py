"""A 32-node rack fails at once in a real 10,000-node slurmctld (devcluster with slurmd-less
nodes, bench/bigcluster.py) while the controller ingests 2,000 reports/s: time from the first
failure report sent to all 32 nodes drained in Slurm (read back with scontrol) through the
real controller, its real Slurm backend (`cli`; `rest` reads through slurmrestd where the
version has it, 22.05 changes nodes with scontrol either way) and real scontrol. Then a
second rack fails: the blast-radius guard (0.5 % of the partition = 50 nodes) must stop it.
Run: python -m bench.rack_failure [cli|rest ...]"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from babysitter.controller.api.auth import node_token
from bench.bigcluster import (
    DBE,
    Load,
    Slurmctld,
    cluster_up,
    node_names,
    report,
    resume_all,
    show_nodes,
    start_controller,
    tick_stats,
)
from bench.common import figure, write_result

WARMUP_S = 30.0
GUARD_FRACTION = 0.005
REASON = f"babysitter: {DBE['check']}: {DBE['message']}"


def drained(info: Any, names: list[str]) -> dict[str, str]:
    return {
        n: reason
        for n, (state, reason) in show_nodes(info, names).items()
        if "DRAIN" in state.split("+")
    }


def fail(ctl: Any, nodes: list[str]) -> None:
    """The rack's agents report at once, like 32 separate machines: each report real (its
    node's token) on its own connection, opened and encoded beforehand, then all sent
    together. (A thread with its own HTTP client per node, in this process beside the load
    generator, spread the 32 reports over 1-2 s of client-side work.)"""
    asyncio.run(_fail(ctl, nodes))


async def _fail(ctl: Any, nodes: list[str]) -> None:
    host, port = ctl.url.split("://", 1)[1].split(":")
    reqs = []
    for n in nodes:
        body = json.dumps(report(n, [DBE])).encode()
        reqs.append(
            f"POST /api/v1/reports HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {node_token(ctl.secret, n)}\r\nX-Babysitter-Node: {n}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    conns = [await asyncio.open_connection(host, int(port)) for _ in nodes]
    for (_, w), req in zip(conns, reqs, strict=True):
        w.write(req)
    for r, w in conns:
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status not in (200, 202):
            raise RuntimeError(f"rack report refused: {head[:200]!r}")
        w.close()


def run_backend(info: Any, backend: str, work: Path) -> tuple[list[dict[str, Any]], dict]:
    ctld = Slurmctld(info)
    names = node_names(info)
    fake = info.fake_nodes
    rack, rack2 = fake[4999:5031], fake[5999:6031]
    limit = int(GUARD_FRACTION * len(names))
    ctl = start_controller(
        info,
        work / backend,
        {
            "BABYSITTER_POLICY__MAX_DRAINED_FRACTION": str(GUARD_FRACTION),
            "BABYSITTER_POLICY__MAX_DRAINS_PER_HOUR": "1000",
        },
        backend,
    )
    load = Load(ctl, names, skip=set(rack + rack2))
    try:
        load.start()
        time.sleep(WARMUP_S)  # every node reported, the policy loop in its steady state
        ctld.reset()
        t0 = time.monotonic()
        fail(ctl, rack)
        done: dict[str, str] = {}
        while time.monotonic() - t0 < 120:
            done = drained(info, rack)
            if len(done) == len(rack):
                break
            time.sleep(0.2)
        handled = time.monotonic() - t0
        load_at_rack = os.getloadavg()  # the 2-core machine is shared: how busy it was
        rpcs = ctld.rpcs()
        right = sum(1 for r in done.values() if r == REASON)
        fail(ctl, rack2)
        time.sleep(15)  # several ticks: the guard must hold, not just delay
        second = drained(info, rack2)
        ticks = tick_stats(ctl.ticks())
        ingest = load.stop()
    finally:
        load.stop()
        ctl.stop()
        resume_all(info, rack + rack2)
    total = len(done) + len(second)
    figs = [
        figure(
            f"32-node rack failure in 10k real Slurm nodes, {backend}: decided and executed",
            handled,
            "s",
            goal="<= 5 s",
            met=handled <= 5.0 and len(done) == len(rack),
        ),
        figure(
            f"rack nodes drained with the right reason, {backend}",
            right,
            "nodes",
            goal="= 32",
            met=right == len(rack),
        ),
        figure(
            f"second rack: total drained with a {GUARD_FRACTION:.1%} guard (limit {limit}), "
            f"{backend}",
            total,
            "nodes",
            goal=f"<= {limit}",
            met=total <= limit,
        ),
        figure(
            f"scontrol update RPCs for the rack's 32 drains, {backend}",
            rpcs.get("REQUEST_UPDATE_NODE", (0, 0))[0],
            "RPCs",
            goal="1 (batched)",
            met=rpcs.get("REQUEST_UPDATE_NODE", (0, 0))[0] == 1,
        ),
        figure(
            f"ingest latency at 2000 reports/s during the rack failure, {backend}",
            ingest.get("p50", float("nan")),
            "s",
            goal="p99 <= 0.1 s",
            met=ingest.get("p99", 1.0) <= 0.1 and ingest["errors"] == 0,
            **{k: v for k, v in ingest.items() if k != "p50"},
        ),
    ]
    details = {
        "rpcs_during_rack_failure": {k: v[0] for k, v in rpcs.items()},
        "wrong_reasons": {n: r for n, r in done.items() if r != REASON},
        "ticks": ticks,
        "loadavg_at_rack_failure": load_at_rack,
    }
    return figs, details


def main(argv: list[str]) -> int:
    backends = argv or ["cli", "rest"]
    t0 = time.monotonic()
    figs: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-rack-") as d:
        dc, info, up_s = cluster_up(Path(d) / "cluster")
        try:
            figs.append(
                figure(
                    f"devcluster up with {len(info.fake_nodes)} slurmd-less nodes",
                    up_s,
                    "s",
                    goal="seconds",
                    met=up_s <= 60,
                )
            )
            for b in backends:
                f, det = run_backend(info, b, Path(d))
                figs += f
                details[b] = det
        finally:
            dc.down()
    write_result(
        "rack_failure",
        figs,
        {
            "nodes": 4 + 10_000,
            "rack": 32,
            "slurm": "real slurmctld 22.05",
            "loadavg_at_end": os.getloadavg(),  # the 2-core machine is shared
            **details,
        },
        settings={
            "nodes": 4 + 10_000,
            "rack": 32,
            "warmup_s": WARMUP_S,
            "guard_fraction": GUARD_FRACTION,
        },
        duration_s=round(time.monotonic() - t0, 1),
    )
    for f in figs:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
