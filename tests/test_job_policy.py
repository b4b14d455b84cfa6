"""The pure job policy: facts in, a decision out (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from babysitter.controller.loop.decide.link_hold import HoldFacts, decide_hold, grace_for, job_phase
from babysitter.controller.loop.jobs.job_policy import decide_requeue, max_requeues
from babysitter.finding import Finding
from tests.fixtures.slurm import wait_for


def test_requeue_until_the_limit_then_hold():
    assert decide_requeue(0, 0, [], 3).kind == "requeue"
    assert decide_requeue(2, 2, [], 3).kind == "requeue"
    assert decide_requeue(3, 3, [], 3).kind == "hold"
    assert decide_requeue(0, 0, [], 0).kind == "hold"


def test_one_fault_one_requeue_per_restart_generation():
    hist = [{"event": "requeue", "restart_count": 1}]
    assert decide_requeue(1, 1, hist, 3).kind == "skip"
    assert decide_requeue(2, 1, hist, 3).kind == "requeue"
    held = [{"event": "held", "restart_count": 4}]
    assert decide_requeue(4, 3, held, 3).kind == "skip"


@pytest.mark.parametrize("bad", ["²", "٣", "1" * 9, "-1", "", "3.0", True, None, 2.5])
def test_max_requeues_takes_small_ascii_numbers_only(bad):
    with pytest.raises(ValueError):
        max_requeues({"max_requeues": bad})


def test_max_requeues_default_and_values():
    assert max_requeues({}) == 3
    assert max_requeues({"max_requeues": 0}) == 0
    assert max_requeues({"max_requeues": "7"}) == 7


def test_a_stuck_item_is_not_restarted_and_a_full_pool_fails_fast(tmp_path):
    import threading

    from babysitter.config import Config
    from babysitter.controller.db.store import Store
    from babysitter.controller.loop.remediation import make_engine
    from babysitter.slurm.cli import CliSlurmClient

    store = Store(f"sqlite:///{tmp_path / 'b.db'}")
    store.upgrade()
    eng = make_engine(Config(), store, slurm=CliSlurmClient(slurm_conf=tmp_path / "none"))
    release = threading.Event()
    try:
        with pytest.raises(TimeoutError, match="gave up"):
            eng.bounded(lambda: release.wait(30), 0.1, key="job 1")
        with pytest.raises(TimeoutError, match="still stuck"):
            eng.bounded(lambda: 1, 5, key="job 1")
        for k in (2, 3, 4):
            with pytest.raises(TimeoutError, match="gave up"):
                eng.bounded(lambda: release.wait(30), 0.1, key=f"job {k}")
        with pytest.raises(TimeoutError, match="workers are stuck"):
            eng.bounded(lambda: 1, 5, key="job 5")
        release.set()

        def runs_again() -> bool:
            try:
                return eng.bounded(lambda: 42, 5, key="job 1") == 42
            except TimeoutError:  # its thread is finishing
                return False

        wait_for(runs_again, 10, "job 1 runs again once its thread is free")
    finally:
        release.set()
        eng.close()
        store.close()


# ---- drain fast, requeue on evidence: a requeue held for a link fault's grace


def _finding(code: str, severity: str = "critical") -> Finding:
    return Finding(
        check="ib.ports",
        component="ib:mlx5_0/1",
        severity=severity,
        code=code,
        message=code,
        action="drain",
    )


def test_only_a_link_fault_holds_the_requeue_and_a_zero_grace_holds_nothing():
    down, retrained = _finding("ib.port_down"), _finding("ib.link_downed")
    assert grace_for([down], 30) == 30
    assert grace_for([retrained, _finding("ib.symbol_error", "warning")], 30) == 30
    assert grace_for([down], 0) == 0  # 0: requeue at once, as before
    # another fault beside the link, a flapping port, NVLink, or no fault at all: at once
    assert grace_for([down, _finding("xid.79")], 30) == 0
    assert grace_for([_finding("ib.port_flapping")], 30) == 0
    assert grace_for([_finding("nvlink.down")], 30) == 0
    assert grace_for([], 30) == 0


def _facts(**kw) -> HoldFacts:
    t0 = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)
    at = kw.pop("at_s", 10)
    base = dict(
        now=t0 + timedelta(seconds=at),
        until=t0 + timedelta(seconds=30),
        job="running",
        job_state="RUNNING",
        drained=True,
        link_down=True,
    )
    return HoldFacts(**{**base, **kw})


@pytest.mark.parametrize(
    ("facts", "kind", "why"),
    [
        # within the grace, port still down: the job is left alone
        (dict(at_s=10), "wait", "link grace until"),
        # the port came back and the node was resumed by the clean-report rule: never touched
        (dict(at_s=10, drained=False, link_down=False), "release", "node resumed"),
        # past the grace and still down: a fault the job dies of
        (dict(at_s=30), "requeue", "still down after the grace"),
        (dict(at_s=31, link_down=None), "requeue", "no fresh report"),
        # the job died by itself (NCCL gave up): requeued at once, grace or not
        (dict(at_s=5, job="failed", job_state="NODE_FAIL"), "requeue", "NODE_FAIL"),
        (dict(at_s=5, job="ended", job_state="COMPLETED"), "release", "COMPLETED"),
        # something else broke on the node: no reason to wait
        (dict(at_s=5, other_fault="node1: xid.79"), "requeue", "xid.79"),
        # link back in the grace, node not resumed yet: wait for the resume, bounded
        (dict(at_s=40, link_down=False), "wait", "waiting for the node's resume"),
        (dict(at_s=30 + 601, link_down=False), "release", "job left running"),
    ],
)
def test_held_requeue_decision(facts, kind, why):
    d = decide_hold(_facts(**facts))
    assert d.kind == kind and why in d.why


@pytest.mark.parametrize(
    ("states", "phase"),
    [
        (("RUNNING",), "running"),
        (("COMPLETING",), "running"),
        (("FAILED",), "failed"),
        (("NODE_FAIL",), "failed"),
        (("COMPLETED",), "ended"),
        (("CANCELLED",), "ended"),
        (("PENDING",), "ended"),
        ((), "ended"),
    ],
)
def test_job_phase_of_slurm_states(states, phase):
    assert job_phase(states) == phase


def test_an_unchanged_babysat_job_is_not_rewritten_every_scan(tmp_path):
    """Thousands of babysat jobs were each rewritten (one transaction) every job_scan_s: an
    unchanged job is written once; a change Slurm shows, and a requeue's own write, are
    still written (the table always says what Slurm says)."""
    from dataclasses import replace

    from babysitter.slurm.client import SlurmJob
    from tests.fixtures.healing import Cluster

    c = Cluster(tmp_path, slurm={"job_scan_s": 0})
    job = SlurmJob(41, name="train", states=("RUNNING",), nodes=("node1",), comment="babysit")
    c.slurm.add_job(job)
    writes: list[int] = []
    real = c.store.upsert_job

    def counted(job_id: int, **values: object) -> None:
        writes.append(job_id)
        real(job_id, **values)

    c.store.upsert_job = counted  # type: ignore[method-assign]
    for _ in range(5):
        c.tick()
    assert writes == [41]
    (row,) = c.store.jobs()
    assert row["state"] == "RUNNING" and row["nodes"] == ["node1"]
    c.slurm.remove_job(41)
    c.slurm.add_job(replace(job, states=("RUNNING",), restart_count=1))
    c.tick()
    c.tick()
    assert writes == [41, 41]
    assert c.store.jobs()[0]["restart_count"] == 1
    c.close()
