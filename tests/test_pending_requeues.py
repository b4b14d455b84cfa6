"""The pending requeues a run of the tick's due actions keeps (jobs/pending_requeues.py): read
once, and answering as a fresh read of the store would after the run's own writes, so a job's
requeue is neither queued twice nor swallowed by one the run has already carried out."""

from __future__ import annotations

from dataclasses import replace

from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.store import Store
from babysitter.controller.loop.jobs.pending_requeues import PendingRequeues


def _requeue(store: Store, job: int, rule: str = "requeue") -> Action:
    return store.record(Action(ActionKind.REQUEUE, job_id=job, node="n1", reason="x", rule=rule))


def _fresh(store: Store, job: int) -> Action | None:
    return PendingRequeues(store).of(job)  # outside a run: read from the store


def test_inside_a_run_the_kept_requeues_answer_as_a_fresh_read_would(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    held = _requeue(store, 7, rule="requeue_held")
    _requeue(store, 8)
    kept = PendingRequeues(store)
    with kept.kept():
        assert kept.of(7) == held == _fresh(store, 7)
        # the run queues a requeue for job 9 and ends job 7's hold: both seen as written
        new = _requeue(store, 9)
        kept.wrote(new)
        assert kept.of(9) == new == _fresh(store, 9)
        ended = replace(held, rule="requeue", outcome="hold ended: another fault")
        store.update_action(held.id, rule="requeue", outcome=ended.outcome)
        kept.wrote(ended)
        assert kept.of(7) == ended and _fresh(store, 7) is not None
        # the run carries job 7's requeue out: a later fault on job 7 must queue a new one
        store.update_action(held.id, status=ActionStatus.DONE)
        kept.settled(held)
        assert kept.of(7) is None and _fresh(store, 7) is None
        assert kept.of(8) is not None and kept.of(10) is None
    store.close()


def test_a_run_reads_the_pending_actions_once_and_outside_it_every_time(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    _requeue(store, 7)
    reads: list[int] = []
    real = store.actions
    store.actions = lambda *a, **k: reads.append(1) or real(*a, **k)  # type: ignore[method-assign]
    kept = PendingRequeues(store)
    with kept.kept():
        for job in (7, 8, 9):
            kept.of(job)
            kept.wrote(_requeue(store, job + 100))
    assert len(reads) == 1
    kept.of(7)
    kept.of(7)
    assert len(reads) == 3
    store.close()
