"""The SDC schedule (loop/sdc/schedule.py) against the in-memory Slurm stand-in and a
real store: what it holds and when, what it never touches, what it costs slurmctld at 10,000
nodes, and how it picks up after a restart. The same schedule on a real Slurm devcluster is in
tests/test_sdc_e2e.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.api.orders import OrderBook
from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store
from babysitter.controller.loop.read.context import LoopContext
from babysitter.controller.loop.sdc.schedule import HOLD_PREFIX, SdcScheduler
from babysitter.controller.loop.sdc.store import schedule_rows
from babysitter.report import Report
from babysitter.slurm.client import SlurmJob, SlurmNode
from bench.slurm_standin import InMemorySlurm

T0 = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)
READY = {"sdc_ready": True}  # what an agent running the SDC check says in every report


@dataclass
class Snapshot:
    """The part of SlurmSnapshot the schedule reads; `listing()` is a new node listing."""

    slurm: InMemorySlurm
    nodes: dict[str, SlurmNode] = field(default_factory=dict)
    ok: bool = True
    read_at: float = 0.0

    def listing(self) -> None:
        self.nodes = {n.name: n for n in self.slurm.nodes()}
        self.read_at += 1


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class World:
    store: Store
    slurm: InMemorySlurm
    snap: Snapshot
    clock: Clock
    sched: SdcScheduler
    now: datetime = T0

    def advance(self, seconds: float) -> None:
        self.clock.t += seconds
        self.now += timedelta(seconds=seconds)

    def step(self, seconds: float = 1.0, listing: bool = True) -> None:
        self.advance(seconds)
        if listing:
            self.snap.listing()
        self.sched.tick(self.now)

    def report(self, nodes: list[str], metrics: dict[str, dict[str, Any]] | None = None) -> None:
        """Agents report now (alive); `metrics`: per node, what its report carries."""
        if not nodes:
            return
        ReportWriter(self.store).write(
            [
                Report(
                    node=n,
                    report_id=str(uuid.uuid4()),
                    sent_at=self.now,
                    findings=[],
                    # none: the node keeps the metrics it had (as ingest does)
                    metrics={**READY, **metrics[n]} if metrics and n in metrics else {},
                )
                for n in nodes
            ]
        )
        # the writer stamps receipt with the wall clock; the schedule runs on the test's clock
        with self.store.engine.begin() as c:
            c.execute(
                update(m.nodes).where(m.nodes.c.name.in_(nodes)).values(last_report_at=self.now)
            )

    def answer_orders(self, ran: bool = True) -> list[str]:
        """Every node with an order runs the test and reports it; returns those nodes."""
        orders = {r.node: r.order_id for r in self.sched.rows.values() if r.order_id}
        self.report(
            sorted(orders),
            {
                n: {
                    "sdc": {
                        "order": oid,
                        "ran": ran,
                        "code": "sdc.passed" if ran else "sdc.skipped",
                        "message": "SDC test passed" if ran else "SDC test not run: GPUs busy",
                        "library": "numpy-2",
                        "finished_at": self.now.timestamp(),
                        "gflops": {"gpu0": 100.0},
                    }
                }
                for n, oid in orders.items()
            },
        )
        return sorted(orders)

    def rows(self) -> dict[str, dict[str, Any]]:
        return {r["node"]: r for r in schedule_rows(self.store)}


def world(tmp_path: Path, names: list[str], **sdc: Any) -> World:
    store = Store(f"sqlite:///{tmp_path / 'b.db'}")
    store.upgrade()
    cfg = parse_config({"checks": {"sdc": {"interval_s": 3600, **sdc}}})
    slurm = InMemorySlurm(names)
    snap = Snapshot(slurm)
    clock = Clock()
    sched = SdcScheduler(LoopContext(cfg, store, slurm, snap), clock=clock)  # type: ignore[arg-type]
    w = World(store, slurm, snap, clock, sched)
    with store.engine.begin() as c:  # every agent has reported (rows as ingest writes them)
        c.execute(
            m.nodes.insert(),
            [
                {
                    "name": n,
                    "first_seen_at": T0,
                    "last_report_at": T0,
                    "open_findings": [],
                    "metrics": READY,
                }
                for n in names
            ],
        )
    return w


def held(w: World) -> set[str]:
    return {n for nodes in w.slurm.holds(HOLD_PREFIX).values() for n in nodes}


def test_idle_nodes_are_held_ordered_and_released_after_their_result(tmp_path):
    w = world(tmp_path, ["n1", "n2", "n3"])
    w.step()
    assert held(w) == {"n1", "n2", "n3"}
    orders = OrderBook(w.store)
    orders.refresh()
    part = orders.answer_part("n2")
    assert part.startswith(b',"orders":[{"check":"sdc.matmul","id":"')
    assert orders.answer_part("elsewhere") == b""
    w.answer_orders()
    w.step()
    assert held(w) == set()
    with w.store.engine.connect() as c:
        logged = [tuple(r) for r in c.execute(select(m.audit_log.c.kind, m.audit_log.c.actor))]
    assert logged == [("sdc_hold", "sdc"), ("sdc_release", "sdc")]
    rows = w.rows()
    assert all(r["last_code"] == "sdc.passed" and not r["testing"] for r in rows.values())
    assert rows["n1"]["last_library"] == "numpy-2" and rows["n1"]["last_gflops"] == {"gpu0": 100}
    orders.refresh()
    assert orders.answer_part("n2") == b""  # answered: not handed out again
    # not due again before interval_s
    w.advance(600)
    w.report(["n1", "n2", "n3"])
    w.step()
    assert held(w) == set()
    w.advance(3000)
    w.report(["n1", "n2", "n3"])
    w.step()
    assert held(w) == {"n1", "n2", "n3"}


def test_a_node_running_a_job_is_never_held_and_says_why(tmp_path):
    w = world(tmp_path, ["n1", "n2"])
    w.slurm.add_job(SlurmJob(7, states=("RUNNING",), nodes=("n1",)))
    w.slurm._nodes["n1"] = replace(w.slurm._nodes["n1"], state="ALLOCATED")
    for _ in range(5):
        w.advance(60)
        w.report(["n1", "n2"])
        w.step()
        w.answer_orders()
        assert "n1" not in held(w)
    rows = w.rows()
    assert rows["n1"]["last_run_at"] is None
    assert (
        rows["n1"]["waiting"] == "Slurm shows it ALLOCATED (jobs running): tested only while idle"
    )
    assert rows["n2"]["last_code"] == "sdc.passed"


def test_a_job_that_started_since_the_listing_makes_slurm_refuse_the_hold(tmp_path):
    """The listing said idle, but a job got n2 since: slurmctld refuses the whole batch (no
    IGNORE_JOBS); the others are held from the next listings, n2 never."""
    w = world(tmp_path, ["n1", "n2", "n3", "n4"])
    w.snap.listing()
    w.slurm.add_job(SlurmJob(8, states=("RUNNING",), nodes=("n2",)))
    w.step(listing=False)
    assert held(w) == set()
    assert "a job started there" in w.rows()["n2"]["waiting"]
    for _ in range(8):
        w.step()  # the stand-in keeps n2 IDLE in its listing: only the hold can tell
    assert held(w) == {"n1", "n3", "n4"}
    assert w.rows()["n2"]["order_id"] is None


def test_no_answer_releases_the_node_untested_and_says_why(tmp_path):
    w = world(tmp_path, ["n1"], result_timeout_s=120)
    w.step()
    assert held(w) == {"n1"}
    w.step(60)
    assert held(w) == {"n1"}
    w.step(61)
    assert held(w) == set()
    row = w.rows()["n1"]
    assert row["last_run_at"] is None and "no answer from the agent within 120 s" in row["waiting"]


def test_a_node_whose_agent_does_not_run_the_check_is_never_held(tmp_path):
    """An older agent, or one with [checks.sdc] enabled = false: holding its node would only
    keep jobs off it until the order times out."""
    w = world(tmp_path, ["n1", "n2"])
    with w.store.engine.begin() as c:
        c.execute(update(m.nodes).where(m.nodes.c.name == "n1").values(metrics={"x": 1}))
    w.step()
    assert held(w) == {"n2"}
    assert w.rows()["n1"]["waiting"].startswith("its agent does not run the SDC check")


def test_a_skipped_run_is_not_a_test_and_is_tried_again(tmp_path):
    w = world(tmp_path, ["n1"])
    w.step()
    w.answer_orders(ran=False)
    w.step()
    row = w.rows()["n1"]
    assert row["last_run_at"] is None and row["waiting"] == "SDC test not run: GPUs busy"
    assert held(w) == set()
    w.advance(1800)  # RETRY_S, the interval being longer
    w.report(["n1"])
    w.step()
    assert held(w) == {"n1"}


def test_nodes_under_test_are_capped_cluster_wide(tmp_path):
    names = [f"n{i:02d}" for i in range(10)]
    w = world(tmp_path, names, max_concurrent=4)
    w.step()
    assert len(held(w)) == 4
    w.step()
    assert len(held(w)) == 4
    waiting = [r["waiting"] for r in w.rows().values() if not r["testing"]]
    assert waiting and all("waiting for a slot (at most 4 nodes" in x for x in waiting)
    w.answer_orders()
    w.step()
    w.step()
    assert len(held(w)) == 4 and len([r for r in w.rows().values() if r["last_run_at"]]) == 4


def test_a_restarted_controller_deletes_unknown_holds_and_closes_lost_orders(tmp_path):
    w = world(tmp_path, ["n1", "n2"])
    w.step()
    assert held(w) == {"n1", "n2"}
    (name,) = w.slurm.holds(HOLD_PREFIX)
    w.slurm.shrink_hold(name, ["n1"])  # n2's part of the hold ended meanwhile
    w.slurm.hold_idle(HOLD_PREFIX + "stray", ["n3"], "root", 10)
    first = {n: r["order_id"] for n, r in w.rows().items()}
    cfg = parse_config({})
    w.sched = SdcScheduler(LoopContext(cfg, w.store, w.slurm, w.snap), clock=w.clock)  # type: ignore[arg-type]
    w.step(listing=False)
    holds = w.slurm.holds(HOLD_PREFIX)
    assert name in holds and HOLD_PREFIX + "stray" not in holds  # ours kept, the stray deleted
    rows = w.rows()
    assert rows["n1"]["order_id"] == first["n1"]  # still under test: its order stands
    assert rows["n2"]["order_id"] not in (None, first["n2"])  # lost: closed, and due again
    w.answer_orders()
    w.step()
    assert w.slurm.holds(HOLD_PREFIX) == {}


@pytest.mark.slow  # 10,000 simulated nodes: seconds of pure computation, no fixture tells
def test_slurm_calls_stay_within_the_budget_at_10000_nodes(tmp_path):
    """Every node due at once (a fresh install): over 5 simulated minutes the schedule's Slurm
    calls stay within max_slurm_rpc_per_s plus its burst, and it still tests nodes at the rate
    a 4 h interval needs at 10,000 nodes (0.7/s)."""
    names = [f"n{i:05d}" for i in range(10_000)]
    w = world(tmp_path, names, interval_s=4 * 3600)
    w.step()
    w.slurm.calls.clear()
    seconds = 300
    for t in range(seconds):
        if t % 10 == 0:  # agents answer on their report cycle
            w.answer_orders()
        w.step(listing=t % 5 == 0)  # a node listing every slurm.node_refresh_s
    ops = [op for op, _ in w.slurm.calls if op != "nodes"]
    assert len(ops) <= 0.2 * seconds + 5, ops
    tested = sum(1 for r in w.sched.rows.values() if r.last_run_at is not None)
    assert tested / seconds >= 10_000 / (4 * 3600), tested
