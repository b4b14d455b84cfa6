"""The policy loop decides on a new fault when its report is stored, not at the next interval:
a critical report wakes it (with an hour's interval, a tick follows). The same fault reported
again (a drained node keeps sending it) and healthy reports do not wake it. A rack reporting
while the loop is busy drains in one Slurm call per reason. Asserted on wakes and Slurm
calls, never on how fast a loaded machine ticked."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi.testclient import TestClient

from babysitter.controller.loop.remediation import make_engine
from babysitter.controller.runtime import Controller
from babysitter.slurm.client import SlurmNode
from tests.fixtures.controller import controller_config
from tests.fixtures.healing import HealingSlurm
from tests.fixtures.reports import DBE, wire_report
from tests.fixtures.slurm import wait_for


class CountedEvent(threading.Event):
    """The wake event, counting who set it: "did this report wake the loop" is read here,
    not guessed from how soon a tick followed."""

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


@contextmanager
def running_loop(secrets, tmp_path) -> Iterator[tuple[TestClient, list[float], CountedEvent]]:
    """A controller whose policy loop (every hour: any second tick within a test is a wake)
    only records when it ticks; its first tick has happened."""
    cfg = controller_config(
        secrets, f"sqlite:///{tmp_path / 'w.db'}", controller={"loop_interval_s": 3600}
    )
    ctl = Controller(cfg)
    ctl.store.upgrade()
    ctl.writer.start()
    woken = CountedEvent()
    ctl.wake.event = woken
    ticks: list[float] = []
    ctl.add_loop("policy", lambda: ticks.append(time.monotonic()))
    loop = threading.Thread(target=ctl.loop_forever, daemon=True)
    loop.start()
    try:
        wait_for(lambda: len(ticks) == 1, 60, "the first tick")
        yield TestClient(ctl.app()), ticks, woken
    finally:
        ctl._stop.set()
        ctl.wake.event.set()
        loop.join(timeout=30)
        ctl.close()
    assert not loop.is_alive()


def test_a_new_critical_report_wakes_the_policy_loop(secrets, tmp_path):
    with running_loop(secrets, tmp_path) as (client, ticks, woken):

        def post(body: dict) -> None:
            r = client.post("/api/v1/reports", json=body, headers=secrets.headers(body["node"]))
            assert r.status_code == 202  # stored, and the wake decided, before the answer

        post(wire_report("node1"))  # healthy: nothing to decide
        post(wire_report("node2"))
        assert woken.sets == 0

        post(wire_report("node1", [DBE]))
        assert woken.sets == 1
        # the interval is an hour: a second tick within the test is the wake's
        wait_for(lambda: len(ticks) == 2, 60, "a tick after the critical report")

        post(wire_report("node1", [DBE]))  # the same fault again (a drained node reports it)
        assert woken.sets == 1

        post(wire_report("node2", [{**DBE, "component": "gpu5"}]))  # news on another node
        assert woken.sets == 2
        wait_for(lambda: len(ticks) == 3, 60, "a tick for the second node's fault")


def test_a_rack_reporting_while_the_loop_is_busy_is_drained_in_one_call(secrets, tmp_path):
    """A rack's reports arrive while the policy loop is in the middle of a tick (here: its
    Slurm read held until all eight are stored): the rack drains with one `scontrol update
    NodeName=a,b,...` for its one reason, not one call per node or per tick. Asserted on the
    Slurm calls, whatever the machine's speed (no tick counts, no timings)."""
    rack = [f"node{i}" for i in range(1, 9)]
    slurm = HeldSlurm(rack + [f"spare{i}" for i in range(92)])  # 8 of 100: within every cap
    cfg = controller_config(
        secrets, f"sqlite:///{tmp_path / 'r.db'}", controller={"loop_interval_s": 3600}
    )
    ctl = Controller(cfg)
    ctl.store.upgrade()
    ctl.writer.start()
    ctl.engine = make_engine(cfg, ctl.store, ctl.metrics, slurm=slurm)
    ctl.add_loop("remediation", ctl.engine.tick)
    loop = threading.Thread(target=ctl.loop_forever, daemon=True)
    loop.start()
    try:
        assert slurm.entered.wait(60), "the first tick never read Slurm"
        client = TestClient(ctl.app())
        for node in rack:  # the tick is held: every report is stored before it goes on
            r = client.post(
                "/api/v1/reports", json=wire_report(node, [DBE]), headers=secrets.headers(node)
            )
            assert r.status_code == 202
        slurm.gate.set()
        wait_for(
            lambda: all(slurm.node(n).drained_or_draining for n in rack), 60, "the rack drained"
        )
    finally:
        slurm.gate.set()
        ctl._stop.set()
        ctl.wake.event.set()
        loop.join(timeout=30)
        ctl.engine.close()
        ctl.close()
    drains = [target for op, target in slurm.calls if op in ("drain", "drain_many")]
    assert len(drains) == 1 and sorted(drains[0].split(",")) == sorted(rack), drains


class HeldSlurm(HealingSlurm):
    """The first read of Slurm's nodes waits for `gate`: a tick held mid-way."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def nodes(self) -> list[SlurmNode]:
        self.entered.set()
        self.gate.wait(120)
        return super().nodes()
