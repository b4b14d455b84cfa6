"""The pure job policy: facts in, a decision out (no I/O)."""

from __future__ import annotations

import pytest

from babysitter.controller.jobs import decide_requeue, max_requeues


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
