"""The periodic SDC test end to end: a real Slurm devcluster, the controller and one agent per
node over simulated GPUs, default settings except a 30 s interval
(BABYSITTER_CHECKS__SDC__INTERVAL_S=30) and the numpy backend (the simulated GPUs cannot
compute; "auto" rightly refuses to test the CPU in their place, tests/test_sdc_check.py).

One cluster for the module, in the order a site would see things: every idle node tested
(node4 runs a user job all along and is never touched), a user job sent to a node under test
waits for the test to end, and a flipped bit drains the node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import perf_metrics
from babysitter.controller.loop.decide.stragglers import perf_from_metrics
from babysitter.controller.loop.sdc.schedule import HOLD_PREFIX
from babysitter.devcluster.sim import SimCluster
from tests.fixtures.slurm import node_state, slurm, submit, wait_for

IDLE = ("node1", "node2", "node3")
BUSY = "node4"  # runs a user job from before the controller starts to the end


class _Sim(SimCluster):
    def _start_controller(self, port: int) -> None:
        # the user job is running before babysitter exists: nothing can race it
        assert self.info is not None
        job = submit(self.info, "-w", BUSY, "--job-name=user-job", wrap="sleep 3600")
        wait_for(lambda: _job_state(self, job) == "RUNNING", 30, "the user job running")
        super()._start_controller(port)


def _job_state(sim: SimCluster, job: int) -> str:
    assert sim.info is not None
    return slurm(sim.info, "squeue", "-h", "-j", str(job), "-o", "%T", check=False).stdout.strip()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory, slurm_daemons: str) -> Iterator[SimCluster]:
    s = _Sim(
        tmp_path_factory.mktemp("sdc-e2e") / "sim",
        n_nodes=4,
        sdc={},  # the schedule with its defaults
        env={
            "BABYSITTER_CHECKS__SDC__INTERVAL_S": "30",
            "BABYSITTER_CHECKS__SDC__BACKEND": "numpy",
        },
    )
    s.up()
    try:
        yield s
    finally:
        s.down()


def _cli(sim: SimCluster, *args: str) -> Any:
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", *args, "--json"],
        env={**os.environ, "BABYSITTER_URL": sim.url, "BABYSITTER_TOKEN": sim.admin_token()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _sdc_findings(sim: SimCluster, node: str) -> list[dict[str, Any]]:
    return [f for f in sim.api(f"/api/v1/findings?node={node}") if f["check"].startswith("sdc")]


def _schedule(sim: SimCluster) -> dict[str, dict[str, Any]]:
    return {r["node"]: r for r in sim.api("/api/v1/sdc")}


def _holds(sim: SimCluster) -> dict[str, str]:
    """Our holds in Slurm now: node -> reservation."""
    assert sim.info is not None
    out = slurm(sim.info, "scontrol", "show", "reservation", "-o").stdout
    held = {}
    for line in out.splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if fields.get("ReservationName", "").startswith(HOLD_PREFIX):
            for node in subprocess_hostnames(sim, fields.get("Nodes", "")):
                held[node] = fields["ReservationName"]
    return held


def subprocess_hostnames(sim: SimCluster, expr: str) -> list[str]:
    assert sim.info is not None
    if not expr:
        return []
    return slurm(sim.info, "scontrol", "show", "hostnames", expr).stdout.split()


def test_every_idle_node_is_tested_within_2_minutes_and_gflops_reach_the_stragglers(sim):
    t0 = time.monotonic()
    wait_for(
        lambda: all(any(f["code"] == "sdc.passed" for f in _cli(sim, "findings", n)) for n in IDLE),
        120,
        "an SDC result for every idle node in `babysitter findings NODE --json`",
    )
    print(f"every idle node tested after {time.monotonic() - t0:.1f} s")
    for n in IDLE:
        passed = [f for f in _cli(sim, "findings", n) if f["code"] == "sdc.passed"]
        assert passed[0]["check"] == "sdc.matmul"
        assert passed[0]["details"]["gflops"]["cpu:0"] > 0
        assert passed[0]["details"]["library"].startswith("numpy-")
    # the straggler policy's own input: the rows it reads and the parse it applies
    store = Store(f"sqlite:///{sim.base / 'babysitter.db'}")
    try:
        perfs = {p.node: p for n, mx in perf_metrics(store) if (p := perf_from_metrics(n, mx))}
    finally:
        store.close()
    assert set(IDLE) <= perfs.keys()
    assert all(perfs[n].gflops and min(perfs[n].gflops) > 0 for n in IDLE)
    # the status page: when and with which backend each node was last tested
    status = _cli(sim, "sdc-status")
    tested = {r["node"]: r for r in status if r["last_run_at"]}
    assert set(IDLE) <= tested.keys()
    assert all(tested[n]["last_library"].startswith("numpy-") for n in IDLE)


def test_a_node_running_a_user_job_all_along_is_never_tested_and_says_why(sim):
    wait_for(lambda: BUSY in _schedule(sim), 60, f"{BUSY} in the schedule")
    row = _schedule(sim)[BUSY]
    assert row["last_run_at"] is None and row["order_id"] is None and not row["testing"]
    assert re.fullmatch(
        r"Slurm shows it (ALLOCATED|MIXED) \(jobs running\): tested only while idle",
        row["waiting"],
    ), row["waiting"]
    assert _sdc_findings(sim, BUSY) == []
    assert node_state(sim.info, BUSY)[0] in ("alloc", "mix")


def test_a_user_job_sent_to_a_node_under_test_waits_until_the_test_is_over(sim, tmp_path):
    """The hold is in Slurm before the order goes out and until the result is in: a job
    submitted meanwhile stays pending and starts only after the test finished."""
    assert sim.info is not None
    held: dict[str, str] = {}

    def some_hold() -> bool:
        held.update(_holds(sim))
        return bool(held)

    wait_for(some_hold, 90, "a node under an SDC hold (the 30 s interval comes round)")
    node = sorted(held)[0]
    stamp = tmp_path / "job-started"
    job = submit(sim.info, "-w", node, wrap=f"date +%s.%N > {stamp}; sleep 1")
    assert _job_state(sim, job) == "PENDING"
    wait_for(stamp.exists, 90, "the user job to run once the hold is gone")
    job_started = float(stamp.read_text())
    runs = [
        f["details"]
        for f in _sdc_findings(sim, node)
        if f["code"] == "sdc.passed" and f["details"]["started_at"] < job_started
    ]
    assert runs, "the test that held the node ran"
    last = max(runs, key=lambda d: d["started_at"])
    assert last["finished_at"] <= job_started


def test_a_bit_flip_on_one_device_drains_the_node(sim):
    assert sim.info is not None
    # one device: the flip is caught against the golden digest the node stores on its first
    # clean run, so there must have been one (run alone, this test comes first)
    wait_for(
        lambda: any(f["code"] == "sdc.passed" for f in _sdc_findings(sim, "node2")),
        120,
        "a clean SDC run on node2 (its golden digest)",
    )
    sim.stop_agent("node2")
    sim.start_agent("node2", env={"BABYSITTER_CHECKS__SDC__INJECT": "[0, 5, 7, 30]"})
    wait_for(lambda: node_state(sim.info, "node2")[0] in ("drain", "drng"), 120, "node2 drained")
    _, reason = node_state(sim.info, "node2")
    assert reason.startswith("babysitter: ") and "sdc" in reason
    crit = [f for f in _sdc_findings(sim, "node2") if f["severity"] == "critical"]
    # C[5,7] = 11.57: the flip makes it ~1e-38, a change the ABFT bound (~100 at n = 2048)
    # lets pass; the bit-wise comparison with the node's golden digest does not
    assert crit and {(f["code"], f["component"], f["action"]) for f in crit} == {
        ("sdc.mismatch", "cpu", "drain")
    }
    assert all(node_state(sim.info, n)[0] not in ("drain", "drng") for n in ("node1", "node3"))
