"""The healer's state machine, written as data: for each phase a `remediations` row can be in
(controller/loop/read/ledger.py Phase), the one function that moves it on each tick, and the
phases that function may move it to. The Healer (healer.py) only looks a row's phase up here.

Rows start (start.py) in an ENTRY phase; a failed rung closes its row and the next rung
starts as a new row. Besides the table, two checks come before any handler (Healer.step): a
node in a maintenance window takes no step, except that a `resetting` order past its expiry
there is closed `timed_out` (admit/order_permission.py expire_quiet); an ACTIVE row whose node
someone else drained is closed `taken_over` (takeover.py). A node returned to service by an
admin closes a `resetting` or held row in its phase (held.py). A TERMINAL row is closed: no
handler, it never moves again."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from babysitter.controller.loop.heal.episode.base import HealerBase, Tick
from babysitter.controller.loop.heal.episode.held import held
from babysitter.controller.loop.heal.episode.rebooting import rebooting
from babysitter.controller.loop.heal.episode.resetting import resetting
from babysitter.controller.loop.heal.episode.validating import validating
from babysitter.controller.loop.heal.episode.waiting import waiting
from babysitter.controller.loop.read.ledger import Phase, Remediation

Handler = Callable[[HealerBase, Remediation, Tick], None]


@dataclass(frozen=True)
class Transition:
    handler: Handler
    # the phases the handler may move the row to; else it stays (perhaps with new evidence)
    to: frozenset[Phase] = frozenset()
    # runs after this tick's new episodes started (so a new rung is issued the tick it is
    # decided), in ledger row order, and not where the node's owner is unknown this tick
    after_starts: bool = False


_HELD = Transition(held)  # until an admin returns the node

TABLE: Mapping[Phase, Transition] = MappingProxyType(
    {
        Phase.WAITING: Transition(
            waiting, frozenset({Phase.RESETTING, Phase.REBOOTING, Phase.FAILED}), after_starts=True
        ),
        Phase.REBOOTING: Transition(
            rebooting, frozenset({Phase.VALIDATING, Phase.FAILED, Phase.TIMED_OUT})
        ),
        Phase.RESETTING: Transition(resetting, frozenset({Phase.VALIDATING, Phase.FAILED})),
        Phase.VALIDATING: Transition(validating, frozenset({Phase.PASSED, Phase.FAILED})),
        Phase.FAILED: _HELD,  # closed at once (fail.py); held like the others if left open
        Phase.TIMED_OUT: _HELD,
        Phase.INSPECT: _HELD,
        Phase.LEMON: _HELD,
        Phase.DRY_RUN: _HELD,
    }
)

# the phases a new row starts in (start.py, lemon_episode.py)
ENTRY = frozenset({Phase.WAITING, Phase.INSPECT, Phase.LEMON, Phase.DRY_RUN})
# closed rows: validated and resumed, cleared by an admin, taken over by someone else
TERMINAL = frozenset({Phase.PASSED, Phase.CLEARED, Phase.TAKEN_OVER})


def transition(state: Phase) -> Transition | None:
    """The handler of `state`'s rows; None for a TERMINAL one."""
    return TABLE.get(state)
