"""The healer's own writes of the lemon ledger keep the tick's remembered reads of it current
(controller/loop/read/ledger.py, issue 52): the RMA step's history, the open episodes and the
lemon count read after a start or a move answer as the database would, with no statement.
Checked against the database itself (a second Store, read outside any tick) over random
sequences of the healer's writes (the open episodes read from the tick's view once a step has
read it, from their own read before), on SQLite and PostgreSQL, with a history listing small
enough to be cut at its limit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event

from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.read.ledger import Ledger, NewRow, Phase
from tests.fixtures.write_through import SEQUENCES, meanwhile, tick_and_truth

NODES = ["n1", "n2", "n3"]
RUNGS = [Rung.REBOOT, Rung.RESET_GPU, Rung.INSPECT]
PHASES = [Phase.WAITING, Phase.REBOOTING, Phase.VALIDATING, Phase.PASSED, Phase.FAILED]
WINDOW = timedelta(days=7)

row = st.builds(
    NewRow,
    node=st.sampled_from(NODES),
    rung=st.sampled_from(RUNGS),
    fault_class=st.just("xid"),
    fault=st.just("Xid 79"),
    state=st.sampled_from([Phase.WAITING, Phase.INSPECT, Phase.DRY_RUN]),
    gpu_uuid=st.sampled_from([None, "GPU-1"]),
    evidence=st.sampled_from([{}, {"issued_at": "t"}, {"order_id": "o"}]),
)
write = st.one_of(
    st.tuples(st.just("add"), st.lists(row, min_size=1, max_size=3)),
    st.tuples(st.just("move"), st.integers(0, 9), st.sampled_from(PHASES)),
    st.tuples(st.just("close"), st.integers(0, 9)),
    st.tuples(st.just("clear"), st.sampled_from(NODES)),  # an admin's: not written through
    st.tuples(st.just("other_thread"), row),
)


def _answers(led: Ledger, now: datetime) -> dict[str, Any]:
    """What the tick's steps ask of the ledger."""
    return {
        "open": sorted((r.to_json() for r in led.open_rows()), key=lambda r: r["id"]),
        "history": [r.to_json() for r in led.history(limit=4)],
        "view": [r.to_json() for r in led.view(now - WINDOW)],
        "node_history": [r.to_json() for r in led.history(node="n1", limit=3)],
        "counted": {
            (n, g): [r.id for r in led.counted(n, {g} if g else set(), now - WINDOW)]
            for n in NODES
            for g in (None, "GPU-1")
        },
    }


def _apply(led: Ledger, truth: Ledger, op: tuple[Any, ...], now: datetime) -> None:
    rows = sorted(truth.history(limit=1000), key=lambda r: r.id)

    def nth(i: int) -> Any:
        return rows[i] if i < len(rows) else None

    match op:
        case ("add", new):
            led.add_many(new, now)
        case ("move", i, phase):
            if (rem := nth(i)) is not None:
                led.move(rem, phase, now, "moved", issued_at="t")
        case ("close", i):
            if (rem := nth(i)) is not None:
                led.close(rem, now, "closed")
        case ("clear", node):
            led.clear(node, "admin", now)
        case ("other_thread", new):
            meanwhile(led.add_many, [new], now)


@SEQUENCES
@given(st.lists(write, min_size=1, max_size=10))
def test_what_the_healer_wrote_is_read_as_the_database_has_it(db_url, ops):
    now = datetime.now(UTC)
    with tick_and_truth(db_url, m.remediations) as (store, other):
        led, truth = Ledger(store), Ledger(other)
        assert _answers(led, now) == _answers(truth, now)
        for op in ops:
            _apply(led, truth, op, now)
            assert _answers(led, now) == _answers(truth, now), op


def test_the_steps_after_a_start_read_the_ledger_without_a_statement(tmp_path):
    """The healer starts three episodes in one statement; the RMA step's history, the next
    tick's open episodes and the lemon count are then answered from what was written."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    led = Ledger(store)
    now = datetime.now(UTC)
    counted: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: counted.append(a[2]))
    with store.tick_reads():
        led.view(now - WINDOW), led.history(limit=200)
        n = len(counted)
        new = [NewRow(x, Rung.REBOOT, "xid", "Xid 79", Phase.WAITING) for x in NODES]
        rems = led.add_many(new, now)
        assert [r.node for r in rems] == NODES and len({r.id for r in rems}) == 3
        led.move(rems[0], Phase.REBOOTING, now, "issued", issued_at=now.isoformat())
        m_ = len(counted)
        assert m_ - n == 2, counted[n:]  # the insert and the move themselves
        assert {r.node for r in led.open_rows()} == set(NODES)
        assert [r.id for r in led.history(limit=200)] == [r.id for r in reversed(rems)]
        assert [r.id for r in led.counted("n1", set(), now - WINDOW)] == [rems[0].id]
        assert len(counted) == m_  # no statement
    store.close()
