"""The tick's own writes of actions keep its remembered reads current (db/action_view.py,
TickReads.writing; issue 52): a step that reads what an earlier step of the tick wrote gets
the rows as a fresh read would, with no statement. Checked against the database itself (a
second Store on the same file, read outside any tick) over random sequences of the writes the
tick makes, with listings small enough to be cut at their limit."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event

from babysitter.controller.db import models as m
from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.episodes import validation_history
from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import (
    Drained,
    Outcome,
    Settled,
    drains_since,
    pending_drain_nodes,
    policy_drain_times,
    record_actions,
    settle,
)
from tests.fixtures.write_through import SEQUENCES, meanwhile, tick_and_truth

NODES = ["n1", "n2", "n3"]
KINDS = [ActionKind.DRAIN, ActionKind.VALIDATE, ActionKind.REQUEUE, ActionKind.RESUME]
STATUSES = [ActionStatus.PENDING, ActionStatus.RUNNING, ActionStatus.DONE, ActionStatus.FAILED]
WHO = ["policy", "fabric", "admin"]

action = st.builds(
    Action,
    kind=st.sampled_from(KINDS),
    node=st.sampled_from(NODES),
    requested_by=st.sampled_from(WHO),
    status=st.sampled_from(STATUSES),
    reason=st.just("r"),
)
write = st.one_of(
    st.tuples(st.just("record"), action),
    st.tuples(st.just("batch"), st.lists(action, min_size=1, max_size=3)),
    st.tuples(st.just("update"), st.integers(0, 11), st.sampled_from(STATUSES)),
    st.tuples(st.just("settle"), st.lists(st.integers(0, 11), max_size=3), st.booleans()),
    st.tuples(st.just("other_thread"), action),
)


def _answers(store: Store, since: datetime) -> dict[str, Any]:
    """What the tick's steps ask of the actions table."""
    return {
        "newest": [a.id for a in store.actions(limit=4)],
        "newest_rows": store.actions(limit=4),
        "pending": store.actions(status=ActionStatus.PENDING, limit=3),
        "running": store.actions(status=ActionStatus.RUNNING),
        "pending_drains": pending_drain_nodes(store, dry_run=None),
        "pending_drains_before_5": pending_drain_nodes(store, 5),
        "drains_since": drains_since(store, since),
        "drain_times": policy_drain_times(store, since),
        "validations": validation_history(store),
    }


def _apply(store: Store, truth: Store, op: tuple[Any, ...]) -> None:
    now = datetime.now(UTC)
    ids = sorted(a.id for a in truth.actions())  # an update names the n-th action (or none)

    def nth(i: int) -> int:
        return ids[i] if i < len(ids) else 10**9

    match op:
        case ("record", a):
            store.record(a)
        case ("batch", actions):
            record_actions(store, actions, now)
        case ("update", i, status):
            store.update_action(nth(i), status=str(status), done_at=now, outcome="x")
        case ("settle", some, drain):
            rows = [r for i in some if (r := truth.action(nth(i))) is not None]
            s = Settled(
                actions=[Outcome(r.id, ActionStatus.DONE, "ok", r.attempts + 1) for r in rows],
                drained=[Drained(n, "r") for n in NODES[:1]] if drain else [],
                follow_ups=[Action(ActionKind.REQUEUE_JOBS, node="n1", reason="r")],
            )
            settle(store, s, now)
        case ("other_thread", a):  # an admin's request through the API, meanwhile
            meanwhile(store.record, a)


@SEQUENCES
@given(st.lists(write, min_size=1, max_size=12))
def test_what_the_tick_wrote_is_read_as_the_database_has_it(db_url, ops):
    since = datetime.now(UTC) - timedelta(hours=1)
    with tick_and_truth(db_url, m.actions) as (store, truth):
        assert _answers(store, since) == _answers(truth, since)
        for op in ops:
            _apply(store, truth, op)
            assert _answers(store, since) == _answers(truth, since), op


def test_a_step_reads_the_actions_the_step_before_it_wrote_without_a_statement(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    since = datetime.now(UTC) - timedelta(hours=1)
    counted: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: counted.append(a[2]))
    with store.tick_reads():
        _answers(store, since), store.pending_actions()  # the tick's first reads
        (drain,) = record_actions(store, [Action(ActionKind.DRAIN, node="n1")], since)
        n = len(counted)
        assert pending_drain_nodes(store) == {"n1"}
        assert [a.id for a in store.pending_actions()] == [drain.id]
        settle(store, Settled(actions=[Outcome(drain.id, ActionStatus.DONE, "ok")]), since)
        store.update_action(drain.id, outcome="drained")
        m = len(counted)
        assert pending_drain_nodes(store) == set()
        assert store.pending_actions() == []
        assert drains_since(store, since) == 1
        assert store.actions(limit=4)[0].outcome == "drained"
        assert len(counted) == m  # no statement: the writes were read as written
        assert m - n == 2, counted[n:]  # the two writes themselves
    store.close()


def test_a_write_it_cannot_tell_makes_the_next_read_go_to_the_database(tmp_path):
    """An update of a column the view does not follow, or of a row it has not seen: the
    listings are read again (never answered from what might be stale)."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    old = store.record(Action(ActionKind.DRAIN, node="n1"))
    counted: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: counted.append(a[2]))
    with store.tick_reads():
        assert [a.id for a in store.pending_actions()] == [old.id]
        store.update_action(old.id, reason="changed by hand")
        n = len(counted)
        assert store.pending_actions()[0].reason == "changed by hand"
        assert len(counted) == n + 1
    store.close()


def test_only_the_tick_thread_is_answered_from_what_the_tick_knows(tmp_path):
    """An API handler's update of an action, meanwhile: it neither reads the tick's memory
    (which the tick thread changes as it goes) nor lets the tick keep answering from it."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    a = store.record(Action(ActionKind.DRAIN, node="n1"))
    with store.tick_reads():
        assert store.reads.known("actions", a.id) is None  # nothing read yet
        store.pending_actions()
        assert store.reads.known("actions", a.id) == a
        seen: list[Any] = []
        t = threading.Thread(target=lambda: seen.append(store.reads.known("actions", a.id)))
        t.start()
        t.join()
        assert seen == [None]
        t = threading.Thread(target=lambda: store.update_action(a.id, status="skipped"))
        t.start()
        t.join()
        assert store.pending_actions() == []
    store.close()


def test_a_full_listing_that_loses_a_row_is_read_again_not_filled_from_older_rows(db_url):
    """The newest three pending actions: the tick settles the newest-but-two and, in the same
    tick, changes a much older pending one it knows from another listing. The listing cannot
    tell which pending action now comes third (the ones between are not known): it is read
    again, never filled up with the older row it happens to know."""
    with tick_and_truth(db_url, m.actions) as (store, truth):
        ids = [store.record(Action(ActionKind.REQUEUE, node="n1")).id for _ in range(6)]
        store.actions(limit=1000)  # the tick knows every row from here
        assert [a.id for a in store.actions(status=ActionStatus.PENDING, limit=3)] == ids[:2:-1]
        settle(
            store, Settled(actions=[Outcome(ids[3], ActionStatus.DONE, "ok")]), datetime.now(UTC)
        )
        store.update_action(ids[0], outcome="looked at")
        got = store.actions(status=ActionStatus.PENDING, limit=3)
        assert got == truth.actions(status=ActionStatus.PENDING, limit=3)
        assert [a.id for a in got] == [ids[5], ids[4], ids[2]]
