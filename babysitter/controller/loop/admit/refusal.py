"""What the admission step (admission.py) answers: the act it was asked about, and for a held
one the rule that held it and why (the metric's labels, the held action's outcome)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Act(StrEnum):
    DRAIN = "drain"
    REBOOT = "reboot"
    RESET_GPU = "reset_gpu"
    RESTART_FABRIC = "restart_fabric"  # like a GPU reset: the node's own, ownership only
    RESUME = "resume"
    VALIDATE = "validate"


class Why(StrEnum):
    """The rule that refused an action (the metric's label)."""

    OWNERSHIP = "ownership"
    UNKNOWN = "unknown"  # a count or state the decision needs could not be read
    MAINTENANCE = "maintenance"
    CAP_SWITCH = "cap_switch"
    CAP_DOMAIN = "cap_domain"
    CAP_PARTITION = "cap_partition"
    CAP_CLUSTER = "cap_cluster"
    CAP_GUARD = "cap_guard"  # [policy] max_drained_fraction of a partition
    CAP_RATE = "cap_rate"
    CAP_REBOOTS = "cap_reboots"


@dataclass(frozen=True)
class Refusal:
    why: Why
    reason: str

    def __str__(self) -> str:
        return f"held: {self.reason}"
