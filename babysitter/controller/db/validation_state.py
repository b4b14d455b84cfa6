"""A node's validation state in its drain episode, and the one predicate "validated for this
drain". Pure (no database): the policy (controller/loop/decide/) asks it on the tick's view;
db/episodes.py reads the states from the database."""

from __future__ import annotations

from dataclasses import dataclass

from babysitter.controller.db.actions import ActionStatus

RUNNING, PASSED, FAILED = "running", "passed", "failed"


@dataclass(frozen=True)
class NodeValidation:
    """A node's validations in its current drain episode."""

    state: str = ""  # "" none | running | passed | failed: the latest one
    failures: int = 0  # failed validations in this episode (what `max_attempts` counts)


def state_of(status: ActionStatus) -> str:
    """A validate action's status as a validation state (skipped, an admin's take-over:
    not a pass)."""
    return {ActionStatus.RUNNING: RUNNING, ActionStatus.DONE: PASSED}.get(status, FAILED)


def validated_for_this_drain(state: str) -> bool:
    """The one predicate "validated for this drain": the node's latest validation since
    babysitter last drained it passed. The policy, the healer and the validator ask it; no
    other test of a validation's pass exists."""
    return state == PASSED
