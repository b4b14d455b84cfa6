"""The healer's state machine (controller/loop/heal/episode/states.py) as a contract: every phase a
`remediations` row can be in has exactly one handler, a terminal phase has none, and a
phase added to the ledger without either fails here."""

from __future__ import annotations

from babysitter.controller.loop.heal.episode.states import ENTRY, TABLE, TERMINAL, transition
from babysitter.controller.loop.read.ledger import ACTIVE, HELD, Phase


def test_every_phase_has_one_handler_or_is_terminal() -> None:
    for phase in Phase:
        assert (phase in TABLE) != (phase in TERMINAL), f"{phase}: a handler, or terminal"
        got = transition(phase)
        assert (got is None) == (phase in TERMINAL), phase
        assert got is None or callable(got.handler), phase


def test_a_terminal_phase_has_no_handler() -> None:
    assert {Phase.PASSED, Phase.CLEARED, Phase.TAKEN_OVER} == TERMINAL
    assert all(transition(p) is None for p in TERMINAL)


def test_the_handled_phases_are_the_ones_the_ledger_keeps_open() -> None:
    """A row the ledger keeps open is stepped every tick; a closed one is terminal."""
    assert set(TABLE) == ACTIVE | HELD
    assert set(Phase) - TERMINAL == ACTIVE | HELD


def test_every_phase_a_handler_moves_to_is_reachable_from_an_entry_phase() -> None:
    assert set(TABLE) >= ENTRY
    seen, todo = set(ENTRY), list(ENTRY)
    while todo:
        got = transition(todo.pop())
        for nxt in got.to if got else ():
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    # cleared (an admin's clear) and taken_over (someone else's drain) come from outside
    assert seen == set(Phase) - {Phase.CLEARED, Phase.TAKEN_OVER}


def test_only_a_waiting_rung_waits_for_the_ticks_starts() -> None:
    """Issued after this tick's new episodes started, so a rung decided now goes out now."""
    assert {p for p, t in TABLE.items() if t.after_starts} == {Phase.WAITING}
