"""The controller's Slurm budget: a tick's Slurm calls do not grow with the cluster. Counted on
the in-memory Slurm stand-in (bench/slurm_standin.py: a 10,000-node slurmctld per test is too
slow here; the real one is measured by bench/slurm_load.py and tests/test_devcluster_scale.py),
which records every client call."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.store import Store
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.finding import Finding
from babysitter.report import Report
from babysitter.slurm.client import SlurmJob
from bench.slurm_standin import InMemorySlurm

DBE = Finding(
    check="gpu.memory",
    component="gpu3",
    severity="critical",
    code="ecc.dbe.volatile",
    message="GPU 3: 1 volatile uncorrected ECC error",
    action="reset_gpu",
)


def _calls(tmp_path: Path, n: int, failing: int) -> tuple[Counter[str], Counter[str], int]:
    """(calls of 3 steady ticks, calls of the tick that handles `failing` nodes failing alike,
    nodes drained)."""
    store = Store(f"sqlite:///{tmp_path / f'{n}.db'}")
    store.upgrade()
    names = [f"n{i:05d}" for i in range(n)]
    now = datetime.now(UTC)
    for k in range(0, n, 2000):
        ReportWriter(store).write(
            [
                Report(node=x, report_id=str(uuid.uuid4()), sent_at=now, findings=[], metrics={})
                for x in names[k : k + 2000]
            ]
        )
    slurm = InMemorySlurm(names)
    for j in range(3):  # babysat jobs on the nodes that will fail
        slurm.add_job(
            SlurmJob(j + 1, states=("RUNNING",), nodes=(names[j],), comment="babysit=ckpt=/x")
        )
    # every tick re-reads nodes and jobs: the worst case for the budget. The SDC schedule's
    # calls come from its own rate limit, not from ticks (tests/test_sdc_schedule.py)
    cfg = parse_config(
        {
            "policy": {"max_drained_fraction": 1.0, "max_drains_per_hour": 1000},
            "slurm": {"node_refresh_s": 0, "job_scan_s": 0},
            "checks": {"sdc": {"enabled": False}},
        }
    )
    engine = make_engine(cfg, store, slurm=slurm)
    engine.tick()
    slurm.calls.clear()
    for _ in range(3):
        engine.tick()
    steady = Counter(op for op, _ in slurm.calls)
    slurm.calls.clear()
    ReportWriter(store).write(
        [
            Report(node=x, report_id=str(uuid.uuid4()), sent_at=now, findings=[DBE], metrics={})
            for x in names[:failing]
        ]
    )
    engine.tick()
    failure = Counter(op for op, _ in slurm.calls)
    drained = sum(1 for x in slurm.nodes() if x.drained_or_draining)
    store.close()
    return steady, failure, drained


@pytest.mark.slow  # 10,000 simulated nodes: seconds of pure computation, no fixture tells
def test_tick_slurm_calls_do_not_grow_with_cluster_size(tmp_path):
    small_steady, small_fail, small_drained = _calls(tmp_path, 50, failing=4)
    big_steady, big_fail, big_drained = _calls(tmp_path, 10_000, failing=32)
    assert (small_drained, big_drained) == (4, 32)
    assert small_steady == big_steady
    assert sum(big_steady.values()) <= 2 * 3  # one node snapshot + one job listing per tick
    # 4 or 32 nodes failing alike: one batched drain and one job listing for all of them
    assert small_fail == big_fail
    assert big_fail["drain_many"] == 1 and big_fail["drain"] == 0


def test_fast_node_line_parse_matches_the_general_one():
    """cli's node_line reads only the keys it needs; same nodes as parse.node_from_scontrol."""
    from babysitter.slurm import parse
    from babysitter.slurm.cli import node_line

    data = Path(__file__).parent / "data" / "slurm" / "22.05" / "scontrol_show_node.txt"
    lines = [x for x in data.read_text().splitlines() if x.startswith("NodeName=")]
    assert lines
    extra = [
        lines[0].replace("State=IDLE", "State=IDLE+DRAIN") + " Reason=babysitter: a b [root@t]",
        lines[0].replace("State=IDLE", "State=DOWN*") + " Reason=Not responding [slurm@t]",
    ]
    for line in lines + extra:
        assert node_line(line) == parse.node_from_scontrol(line)


def test_steady_tick_passes_only_nodes_that_may_need_a_decision(tmp_path):
    """At 2,000 nodes a steady tick hands the policy only the nodes that may need a decision
    (none while all are healthy, but for a sweep's share of them), and still sees each kind
    of change: a fault (drained), a node someone else drains in Slurm (its state written), a
    node gone silent (verdict unknown), the fault clearing (resumed)."""
    from dataclasses import replace
    from datetime import timedelta

    t0 = datetime.now(UTC)
    store, names, slurm, engine = _healthy_cluster(tmp_path, t0)
    engine.tick(t0)  # the first tick is a full pass: every verdict written
    assert {n["verdict"] for n in store.node_rows()} == {"healthy"}
    facts, cluster = engine.facts(t0)
    # only the sweep's share (every node within FULL_PASS_S): 2,000 / 600 ticks
    assert len(facts) <= 4 and cluster.partition_sizes == {"gpu": 2000}

    sick, other, silent = names[10], names[20], names[30]
    _write(store, [_report(sick, t0, [DBE])])
    held = slurm._nodes[other]
    slurm._nodes[other] = replace(held, flags=frozenset({"DRAIN"}), reason="admin: fan")
    engine.tick(t0)
    assert slurm.node(sick).drained_or_draining
    row = store.node(other)
    assert row is not None and row["slurm_reason"] == "admin: fan"
    assert "DRAIN" in row["slurm_state"]

    # everyone but `silent` keeps reporting; past the heartbeat timeout it is unknown
    later = t0 + timedelta(seconds=engine.cfg.controller.heartbeat_timeout_s + 10)
    with store.engine.begin() as c:
        from sqlalchemy import update

        from babysitter.controller.db import models as m

        c.execute(update(m.nodes).where(m.nodes.c.name != silent).values(last_report_at=later))
    engine.tick(later)
    assert store.node(silent)["verdict"] == "unknown"
    assert store.node(names[40])["verdict"] == "healthy"

    for _ in range(engine.cfg.policy.resume_after_clean_checks):
        _write(store, [_report(sick, datetime.now(UTC), [])])
    engine.tick(datetime.now(UTC))
    assert not slurm.node(sick).drained_or_draining
    store.close()


def test_a_slow_node_listing_neither_delays_the_tick_nor_undoes_its_drains(tmp_path):
    """At 2,000 nodes the tick does not wait for a slow `scontrol show node`: it decides on
    the previous listing plus its own drains since, so the failed node is drained once, the
    guard counts it, and a listing started before the drain does not bring it back."""
    import threading
    import time

    now = datetime.now(UTC)
    store, names, slurm, engine = _healthy_cluster(tmp_path, now)
    engine.tick()  # the first listing is waited for
    release = threading.Event()
    listed = slurm.nodes

    def slow_nodes():
        before = listed()  # the state when the listing started
        release.wait()  # until the test lets it go: a tick that waited for it never returns
        return before

    slurm.nodes = slow_nodes  # type: ignore[method-assign]
    _write(store, [_report(names[7], datetime.now(UTC), [DBE])])
    engine.tick()
    assert not release.is_set()  # the tick went on while the listing still hung
    assert slurm.node(names[7]).drained_or_draining
    for _ in range(2):
        engine.tick()
    release.set()
    time.sleep(0.2)
    engine.tick()  # takes up the listing that started before the drain
    engine.tick()
    assert sum(1 for op, _ in slurm.calls if op == "drain_many") == 1
    assert engine.facts(datetime.now(UTC))[1].drained_by_us == {"gpu": 1}
    store.close()


def _healthy_cluster(
    tmp_path: Path, at: datetime, n: int = 2000
) -> tuple[Store, list[str], InMemorySlurm, RemediationEngine]:
    """n nodes, each with one clean report at `at`, in Slurm and the store; an engine over
    them that re-lists Slurm every tick and may drain the whole partition."""
    store = Store(f"sqlite:///{tmp_path / 'cluster.db'}")
    store.upgrade()
    names = [f"n{i:05d}" for i in range(n)]
    _write(store, [_report(x, at, []) for x in names])
    slurm = InMemorySlurm(names)
    cfg = parse_config({"policy": {"max_drained_fraction": 1.0}, "slurm": {"node_refresh_s": 0}})
    return store, names, slurm, make_engine(cfg, store, slurm=slurm)


def _report(node: str, at: datetime, findings: list[Finding]) -> Report:
    return Report(node=node, report_id=str(uuid.uuid4()), sent_at=at, findings=findings, metrics={})


def _write(store: Store, reports: list[Report]) -> None:
    ReportWriter(store).write(reports)
