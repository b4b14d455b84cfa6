"""Whose a node is during an episode, read from its current Slurm reason through the one
predicate (slurm/ownership.py) every automatic step asks before it acts (the healer at each step
of an episode, the admission step right before an action runs, the Slurm client).

babysitter's *automatic* reason is `<prefix> <why>` without a mark: the policy's drains, the
healer's rungs, the validation's verdicts. `<prefix> [manual] …` is an admin's drain through
babysitter and `<prefix> [healthcheck] …` the HealthCheckProgram's: both belong to someone
else, exactly like a reason babysitter never wrote."""

from __future__ import annotations

from enum import StrEnum

from babysitter.slurm.client import SlurmNode
from babysitter.slurm.ownership import automatic_reason


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
