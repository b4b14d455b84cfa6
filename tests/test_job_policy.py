"""The pure job policy: facts in, a decision out (no I/O)."""

from __future__ import annotations

import pytest

from babysitter.controller.loop.jobs import decide_requeue, max_requeues
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
