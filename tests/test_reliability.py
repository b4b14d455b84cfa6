"""Bad days, shortened for `make test`; `make reliability` runs the long form
(BABYSITTER_RELIABILITY=full). Each test prints its figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from babysitter.agent.shipper import Shipper
from babysitter.agent.spool import Spool
from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.store import Store
from babysitter.controller.loop.remediation import make_engine
from babysitter.finding import Finding
from babysitter.report import Report
from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.controller import (
    ControllerProcess,
    controller_config,
    free_port,
)
from tests.fixtures.slurm import slurm, wait_for

FULL = os.environ.get("BABYSITTER_RELIABILITY") == "full"
pytestmark = pytest.mark.reliability

XID79 = Finding(
    check="xid.nvml",
    component="gpu1",
    severity="critical",
    code="xid.79",
    message="XID 79 on GPU 1 (reboot: node fault)",
    action="reboot",
)


# Bounded by its number of cases, never by a clock: a fixed seed and no example database
# (the same cases on a cold machine as on a warm one), no shrinking (a failure is reported as
# found, not minimised for minutes), each request bounded, and the pytest timeout far above
# what the cases take (a safety net, not the test's bound).
SCHEMATHESIS_BOUNDS = [
    "--seed", "42",
    "--generation-database", "none",
    "--no-shrink",
    "--request-timeout", "30",
]  # fmt: skip


@pytest.mark.timeout(1800)
def test_schemathesis_against_openapi(secrets, tmp_path):
    cfg = controller_config(secrets, f"sqlite:///{tmp_path / 'st.db'}", port=free_port())
    ctl = ControllerProcess(
        cfg, env={"BABYSITTER_SLURM__SLURM_CONF": "/nonexistent"}, log=tmp_path / "ctl.log"
    ).start()
    try:
        r = subprocess.run(
            [
                str(Path(sys.executable).parent / "schemathesis"),
                "run",
                f"{ctl.url}/openapi.json",
                "-H",
                f"Authorization: Bearer {secrets.admin}",
                "--max-examples",
                "300" if FULL else "100",
                *SCHEMATHESIS_BOUNDS,
                "-c",
                "not_a_server_error,response_schema_conformance",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
    finally:
        ctl.stop()
    m = re.search(r"(\d+) generated", r.stdout)
    cases = int(m.group(1)) if m else 0
    failures = len(re.findall(r"^_{3,} .* _{3,}$", r.stdout, re.M))
    print(f"\nschemathesis: {cases} cases, {failures} failures")
    assert r.returncode == 0, r.stdout[-4000:]
    assert cases >= 1000


def test_agent_spool_with_controller_down_for_ten_simulated_minutes(secrets, tmp_path):
    """Ten minutes of 1 s reports (600) into a spool bounded at 100, then the controller
    returns: the newest 100 are replayed in order, the 500 oldest dropped and counted."""
    spool = Spool(tmp_path / "spool.db", max_reports=100)
    port = free_port()
    token = secrets.node("node1")
    ship = Shipper(f"http://127.0.0.1:{port}", token, spool, timeout_s=0.5, retries=0, node="node1")
    ids = []
    for i in range(600):  # the controller is down: every report is spooled
        body = {
            "node": "node1",
            "report_id": str(uuid.uuid4()),
            "sent_at": datetime.fromtimestamp(1_700_000_000 + i, UTC).isoformat(),
            "findings": [],
            "metrics": {},
        }
        ids.append(body["report_id"])
        spool.put(body)
    assert spool.size() == 100 and spool.counter("dropped") == 500
    db_url = f"sqlite:///{tmp_path / 'c.db'}"
    ctl = ControllerProcess(
        controller_config(secrets, db_url, port=port),
        env={"BABYSITTER_SLURM__SLURM_CONF": "/nonexistent"},
    ).start()
    try:
        ship.start()
        wait_for(lambda: spool.size() == 0, 60, "spool replayed")
        ship.stop()
    finally:
        ctl.stop()
    store = Store(db_url)
    with store.engine.connect() as c:
        stored = [r[0] for r in c.execute(text("SELECT report_id FROM reports ORDER BY id"))]
    store.close()
    print(
        f"\nspool: sent 600, kept 100, dropped {spool.counter('dropped')}, "
        f"replayed {spool.counter('replayed')}, stored {len(stored)}"
    )
    assert stored == ids[500:]


def test_slurmctld_down_during_a_fault_storm(clean_cluster, devcluster_obj, tmp_path):
    """Faults on three nodes and a babysat job while slurmctld is away: once it is back,
    every intended drain is done exactly once and the job is requeued exactly once."""
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.upgrade()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cfg = parse_config(
        {
            "policy": {"max_drained_fraction": 1.0},
            # three of the four nodes drain: no scope capped at its default half
            "blast_radius": dict.fromkeys(
                ("switch_fraction", "partition_fraction", "cluster_fraction"), 1.0
            ),
            "slurm": {"slurm_conf": clean_cluster.slurm_conf},
        }
    )
    client = CliSlurmClient(slurm_conf=Path(clean_cluster.slurm_conf))
    engine = make_engine(cfg, store, slurm=client)
    job = int(
        slurm(
            clean_cluster,
            "sbatch",
            "--parsable",
            "-w",
            "node1",
            "-o",
            "/dev/null",
            f"--comment=babysit=ckpt={ckpt}",
            "--wrap",
            "sleep 600",
        ).stdout.strip()
    )
    wait_for(lambda: client.job(job).running, 30, "job running")
    for n in clean_cluster.nodes:
        ReportWriter(store).write(
            [
                Report(
                    node=n,
                    report_id=str(uuid.uuid4()),
                    sent_at=datetime.now(UTC),
                    findings=[],
                    metrics={},
                )
            ]
        )
    engine.tick()
    down_s = 60 if FULL else 5
    devcluster_obj.stop_slurmctld()
    try:
        for n in ("node1", "node2", "node3"):
            ReportWriter(store).write(
                [
                    Report(
                        node=n,
                        report_id=str(uuid.uuid4()),
                        sent_at=datetime.now(UTC),
                        findings=[XID79],
                        metrics={},
                    )
                ]
            )
        deadline = time.monotonic() + down_s
        while time.monotonic() < deadline:
            engine.tick()
            time.sleep(0.2)
    finally:
        devcluster_obj.start_slurmctld()
    wait_for(
        lambda: (
            engine.tick() is not None
            and all(client.node(n).drained_or_draining for n in ("node1", "node2", "node3"))
        ),
        90,
        "drains after slurmctld returned",
    )
    wait_for(
        lambda: engine.tick() is not None and client.job(job).restart_count >= 1, 60, "job requeued"
    )
    for _ in range(10):
        engine.tick()
        time.sleep(0.2)
    drains = [a for a in store.actions() if a.kind == "drain" and a.status == "done"]
    requeues = [a for a in store.actions() if a.kind == "requeue" and a.status == "done"]
    print(
        f"\nslurmctld down {down_s} s: drains intended 3, done {len(drains)}; "
        f"requeues {len(requeues)}"
    )
    assert sorted(a.node for a in drains) == ["node1", "node2", "node3"]
    assert [a.job_id for a in requeues] == [job]
    assert client.job(job).restart_count == 1
    store.close()


def test_controller_survives_a_postgres_restart(secrets, pg_admin_dsn, tmp_path):
    """Every connection to the controller's database is killed under load
    (pg_terminate_backend) - what a server restart does to the controller - without
    restarting the machine-wide server the other tests share."""
    import psycopg

    name = f"bs_rel_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    host = pg_admin_dsn.split("://", 1)[1].rsplit("/", 1)[0]
    db_url = f"postgresql+psycopg://{host}/{name}"
    ctl = ControllerProcess(
        controller_config(secrets, db_url, port=free_port()),
        env={"BABYSITTER_SLURM__SLURM_CONF": "/nonexistent"},
        log=tmp_path / "ctl.log",
    ).start()
    acked: list[str] = []
    errors: list[float] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=5, headers=secrets.headers("node1")) as c:
            while not stop.is_set():
                rid = str(uuid.uuid4())
                try:
                    r = c.post(
                        f"{ctl.url}/api/v1/reports",
                        json={
                            "node": "node1",
                            "report_id": rid,
                            "sent_at": datetime.now(UTC).isoformat(),
                            "findings": [],
                            "metrics": {},
                        },
                    )
                    if r.status_code in (200, 202):
                        acked.append(rid)
                    else:
                        errors.append(time.monotonic())
                except httpx.HTTPError:
                    errors.append(time.monotonic())

    t = threading.Thread(target=load)
    t.start()
    try:
        wait_for(lambda: len(acked) > 50, 30, "load running")
        cut = time.monotonic()
        with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
            )
        n = len(acked)
        wait_for(lambda: len(acked) > n + 20, 30, "ingest again")
        recovered = time.monotonic() - cut
    finally:
        stop.set()
        t.join(timeout=30)
        ctl.stop()
    store = Store(db_url)
    stored = set(store.report_ids())
    store.close()
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        f"\npostgres connections cut: ingest back after {recovered:.2f} s, "
        f"{len(errors)} failed requests, {len(acked)} acknowledged, all stored: "
        f"{set(acked) <= stored}"
    )
    assert set(acked) <= stored


def _vm(pid: int, key: str) -> int:
    """A /proc/PID/status figure in MB (VmRSS now, VmHWM the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024
    raise AssertionError(f"no {key}")


@pytest.mark.timeout(1500)  # two schemathesis runs on a loaded 2-core machine
def test_hostile_input_with_a_node_token_and_with_none(secrets, tmp_path):
    """Schemathesis' positive and negative cases against every operation, sent with a node's
    token (and its node header) and with no token at all: never a 5xx, and the controller's
    peak memory stays that of an idle one."""
    cfg = controller_config(secrets, f"sqlite:///{tmp_path / 'h.db'}", port=free_port())
    ctl = ControllerProcess(
        cfg, env={"BABYSITTER_SLURM__SLURM_CONF": "/nonexistent"}, log=tmp_path / "ctl.log"
    ).start()
    assert ctl.proc is not None
    idle = _vm(ctl.proc.pid, "VmHWM")
    runs = {
        "node token": ["-H", f"Authorization: Bearer {secrets.node('node1')}", "-H",
                       "X-Babysitter-Node: node1"],
        "no token": [],
    }  # fmt: skip
    cases = 0
    try:
        for label, headers in runs.items():
            r = subprocess.run(
                [
                    str(Path(sys.executable).parent / "schemathesis"),
                    "run",
                    f"{ctl.url}/openapi.json",
                    *headers,
                    "--max-examples",
                    "70" if FULL else "10",
                    *SCHEMATHESIS_BOUNDS,
                    "-c",
                    "not_a_server_error",
                    "--no-color",
                ],
                capture_output=True,
                text=True,
                cwd=tmp_path,
            )
            m = re.search(r"(\d+) generated", r.stdout)
            n = int(m.group(1)) if m else 0
            cases += n
            print(f"\nschemathesis hostile ({label}): {n} cases, exit {r.returncode}")
            assert r.returncode == 0, r.stdout[-4000:]
        peak = _vm(ctl.proc.pid, "VmHWM")
    finally:
        ctl.stop()
    print(f"hostile input: {cases} cases, 0 server errors, controller peak RSS {peak} MB "
          f"(idle {idle} MB)")  # fmt: skip
    assert cases >= (2000 if FULL else 300)
