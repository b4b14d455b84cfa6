"""The policy loop decides on a new fault when its report is stored, not at the next interval:
with loop_interval_s = 30 a critical report gets a tick within seconds. The same fault
reported again (a drained node keeps sending it) and healthy reports do not wake it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi.testclient import TestClient

from babysitter.controller.runtime import Controller
from tests.fixtures.controller import controller_config
from tests.fixtures.reports import DBE, wire_report
from tests.fixtures.slurm import wait_for


@contextmanager
def running_loop(secrets, tmp_path) -> Iterator[tuple[TestClient, list[float]]]:
    """A controller whose policy loop (every 30 s) only records when it ticks; its first tick
    has happened."""
    cfg = controller_config(
        secrets, f"sqlite:///{tmp_path / 'w.db'}", controller={"loop_interval_s": 30}
    )
    ctl = Controller(cfg)
    ctl.store.upgrade()
    ctl.writer.start()
    ticks: list[float] = []
    ctl.add_loop("policy", lambda: ticks.append(time.monotonic()))
    loop = threading.Thread(target=ctl.loop_forever, daemon=True)
    loop.start()
    try:
        wait_for(lambda: len(ticks) == 1, 10, "the first tick")
        yield TestClient(ctl.app()), ticks
    finally:
        ctl._stop.set()
        ctl.wake.event.set()
        loop.join(timeout=5)
        ctl.close()
    assert not loop.is_alive()


def test_a_new_critical_report_wakes_the_policy_loop(secrets, tmp_path):
    with running_loop(secrets, tmp_path) as (client, ticks):

        def post(body: dict) -> None:
            r = client.post("/api/v1/reports", json=body, headers=secrets.headers(body["node"]))
            assert r.status_code == 202

        post(wire_report("node1"))  # healthy: nothing to decide
        post(wire_report("node2"))
        time.sleep(1.0)
        assert len(ticks) == 1

        sent = time.monotonic()
        post(wire_report("node1", [DBE]))
        wait_for(lambda: len(ticks) == 2, 5, "a tick right after the critical report")
        assert ticks[1] - sent < 5  # the interval is 30 s

        post(wire_report("node1", [DBE]))  # the same fault again (a drained node reports it)
        time.sleep(1.0)
        assert len(ticks) == 2

        post(wire_report("node2", [{**DBE, "component": "gpu5"}]))  # news on another node
        wait_for(lambda: len(ticks) == 3, 5, "a tick for the second node's fault")


def test_a_rack_reporting_one_node_after_another_is_decided_together(secrets, tmp_path):
    """A rack's reports arrive over the agents' polling phase: the first node's fault is
    decided at once, the rest in one tick once the burst is over, not one tick per report
    (so the rack drains with one scontrol update per reason, not one per tick)."""
    with running_loop(secrets, tmp_path) as (client, ticks):
        rack = [f"node{i}" for i in range(1, 9)]
        for node in rack:
            body = wire_report(node, [DBE])
            r = client.post("/api/v1/reports", json=body, headers=secrets.headers(node))
            assert r.status_code == 202
            time.sleep(0.03)
        last_stored = time.monotonic()
        wait_for(lambda: ticks[-1] > last_stored, 10, "a tick after the last report")
        time.sleep(1.0)
        # the first node at once (it might have been alone), the other seven together
        assert len(ticks) - 1 <= 2, f"{len(ticks) - 1} ticks for one rack"
