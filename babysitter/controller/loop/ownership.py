"""Whose a node is, read from its current Slurm reason: the one predicate every automatic step
asks before it acts (the healer at each step of an episode, the admission step right before an
action runs).

babysitter's *automatic* reason is `<prefix> <why>` without a mark: the policy's drains, the
healer's rungs, the validation's verdicts. `<prefix> [manual] …` is an admin's drain through
babysitter and `<prefix> [healthcheck] …` the HealthCheckProgram's: both belong to someone
else, exactly like a reason babysitter never wrote."""

from __future__ import annotations

from enum import StrEnum

from babysitter.controller.loop.policy import HEALTHCHECK_MARK, MANUAL_MARK
from babysitter.slurm.client import SlurmNode


def automatic_reason(reason: str, prefix: str) -> bool:
    """The reason is one babysitter's automation wrote (not an admin's, not the check's)."""
    if not reason.startswith(prefix):
        return False
    rest = reason[len(prefix) :].lstrip()
    return not rest.startswith((MANUAL_MARK, HEALTHCHECK_MARK))


class Owner(StrEnum):
    AUTOMATIC = "automatic"  # babysitter's automatic reason, or no reason at all
    OTHER = "other"  # someone else's reason: an admin (babysitter drain included), a check
    UNKNOWN = "unknown"  # the node is not in the snapshot: nobody can say (hold)


def episode_owner(sn: SlurmNode | None, prefix: str) -> Owner:
    """Who holds a node that babysitter is remediating. No reason at all is the episode's own
    (the validation returns the node inside its reservation; a reboot may clear the reason);
    a reason someone else wrote means they took the node over."""
    if sn is None:
        return Owner.UNKNOWN
    if sn.reason and not automatic_reason(sn.reason, prefix):
        return Owner.OTHER
    return Owner.AUTOMATIC
