"""Fault -> drain latency of the controller loop while an alert webhook never answers (the TCP
connection is accepted by the kernel, no HTTP reply ever comes), beside the same with a
webhook that answers at once, in the same run. Alerts are delivered on the sender thread, so
the ratio should stay near 1. Slurm is the in-memory stand-in (bench/slurm_standin.py) with a
slurmctld-like call latency, so only the loop is measured.
Run: python -m bench.alert_blackhole"""

from __future__ import annotations

import socket
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.store import Store
from babysitter.controller.loop.remediation import make_engine
from babysitter.devcluster.receiver import Receiver
from babysitter.finding import Finding
from babysitter.report import Report
from bench.common import figure, summary, write_result
from bench.slurm_standin import InMemorySlurm

NODES = 50
FAULTS = 20
XID79 = Finding(
    check="xid.kmsg",
    component="gpu3",
    severity="critical",
    code="xid.79",
    message="XID 79 on GPU 3",
    action="reboot",
)


def run(webhook: str, d: Path, tag: str) -> list[float]:
    store = Store(f"sqlite:///{d / f'{tag}.db'}")
    store.upgrade()
    names = [f"n{i:03d}" for i in range(NODES)]
    now = datetime.now(UTC)
    ReportWriter(store).write(
        [
            Report(node=n, report_id=str(uuid.uuid4()), sent_at=now, findings=[], metrics={})
            for n in names
        ]
    )
    slurm = InMemorySlurm(names, call_latency_s=0.005)
    cfg = parse_config(
        {
            "policy": {"max_drained_fraction": 1.0, "max_drains_per_hour": 1000},
            "alerts": {"webhook_url": webhook, "timeout_s": 5.0},
        }
    )
    engine = make_engine(cfg, store, slurm=slurm)
    engine.tick()
    lat = []
    for i in range(FAULTS):
        node = names[i]
        ReportWriter(store).write(
            [
                Report(
                    node=node,
                    report_id=str(uuid.uuid4()),
                    sent_at=datetime.now(UTC),
                    findings=[XID79],
                    metrics={},
                )
            ]
        )
        t0 = time.perf_counter()
        engine.tick()
        lat.append(time.perf_counter() - t0)
        assert slurm.node(node).drained_or_draining, node
    engine.close()
    store.close()
    return lat


def main() -> int:
    t0 = time.monotonic()
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(1024)  # accepted by the kernel, never read or answered
    receiver = Receiver()
    try:
        with tempfile.TemporaryDirectory() as d:
            ok = run(receiver.url + "/hook", Path(d), "ok")
            black = run(f"http://127.0.0.1:{hole.getsockname()[1]}/hook", Path(d), "hole")
    finally:
        receiver.close()
        hole.close()
    a, b = summary(ok), summary(black)
    figs = [
        figure(
            "fault -> drain, one loop tick, webhook never answers (p50)",
            b["p50"],
            "s",
            baseline="same, webhook answers at once",
            baseline_value=a["p50"],
            goal="ratio <= 1.5",
            met=b["p50"] <= 1.5 * a["p50"],
            p99=b["p99"],
            n=b["n"],
        )
    ]
    write_result(
        "alert_blackhole",
        figs,
        {"nodes": NODES, "faults": FAULTS, "answering": a, "black_hole": b},
        settings={"nodes": NODES, "faults": FAULTS},
        duration_s=round(time.monotonic() - t0, 1),
    )
    for f in figs:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
