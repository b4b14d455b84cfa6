"""The rules a decision (or an action) may name, each with its description: a site reads them
in one place, and the API shows the description beside every action the rule caused."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class Rule(StrEnum):
    """The rules a decision (or an action) may name, each with what it means: the API shows the
    description beside every action the rule caused. A misspelled name is a mypy error where
    the decision is made (and a ValueError at run time, see Decision)."""

    _value_: str
    description: str

    def __new__(cls, name: str, description: str) -> Rule:
        rule = str.__new__(cls, name)
        rule._value_ = name
        rule.description = description
        return rule

    CRITICAL_FINDING = "critical_finding", "a critical finding drains the node"
    DRAIN_ACTION = (
        "drain_action",
        "a warning whose recommended action is drain/reset/reboot drains",
    )
    WARNING_SUSPECT = "warning_suspect", "warnings make the node suspect (alert only)"
    HEARTBEAT_MISSING = "heartbeat_missing", "no report within the heartbeat timeout"
    FAULT_CLEARED = (
        "fault_cleared",
        "fault gone and resume_after_clean_checks clean reports: resume",
    )
    NOT_OURS = "not_ours", "drained/down for someone else: never touched, only alerted"
    GUARD_FRACTION = (
        "guard_fraction",
        "more than max(min_drainable, max_drained_fraction x size) of a partition drained",
    )
    GUARD_UNKNOWN = (
        "guard_unknown",
        "partition sizes unknown (no Slurm data): no drain decided, alert",
    )
    JOB_OWNED_FINDING = (
        "job_owned_finding",
        "a finding derived from a job's own output (job logs) never drains a node on its own: "
        "alert naming the job",
    )
    GUARD_RATE = "guard_rate", "max_drains_per_hour reached"
    GUARD_TRIPPED = "guard_tripped", "breaker tripped earlier; needs an admin reset"
    XID_ESCALATION = (
        "xid_escalation",
        "same fatal XID >= xid_escalation_count times within xid_escalation_window_h on one "
        "GPU: hardware inspection",
    )
    LEMON_NODE = (
        "lemon_node",
        "drained >= lemon_drains times within lemon_window_days: lemon node",
    )
    VALIDATE_BEFORE_RESUME = (
        "validate_before_resume",
        "fault gone: a validation job must pass on the node before it returns (if enabled)",
    )
    VALIDATION_EXHAUSTED = (
        "validation_exhausted",
        "validation failed max_attempts times: stays drained for an admin",
    )
    NODE_SLOW = (
        "node_slow",
        "throughput below the fleet median of its GPU model in consecutive measurements",
    )
    # rules of actions that are not the node policy's own decisions
    JOB_ON_FAILED_NODE = (
        "job_on_failed_node",
        "a babysat job on a drained or DOWN node is requeued from its last checkpoint",
    )
    JOB_NCCL_NETWORK = (
        "job_nccl_network",
        "a babysat job whose own NCCL reported a network failure (nccl.transport_error, "
        "nccl.remote_error) is requeued from its last checkpoint, running or just failed; "
        "its nodes are not touched",
    )
    JOB_LINK_GRACE = (
        "job_link_grace",
        "a babysat job on a node drained for a link fault is requeued only if the link is "
        "still down after [policy] link_requeue_grace_s (NCCL rides out a short flap)",
    )
    MANUAL = "manual", "requested by an admin (API or CLI)"
    # controller/loop/decide/fabric.py and controller/loop/decide/blast.py
    SWITCH_SUSPECTED = (
        "switch_suspected",
        "fabric faults on fabric.min_nodes (or half) of a switch's nodes within "
        "fabric.window_s: one switch incident, its nodes drained together (or kept)",
    )
    SWITCH_RECOVERED = (
        "switch_recovered",
        "the suspected switch's nodes all report clean again: resumed together",
    )
    # controller/loop/fabric/nvlink_domain.py: the same correlation, an NVLink domain as the scope
    NVLINK_DOMAIN_SUSPECTED = (
        "nvlink_domain_suspected",
        "critical NVLink fabric findings on fabric.min_nodes (or half) of one NVLink domain's "
        "nodes within fabric.window_s: one domain incident, its nodes drained together",
    )
    NVLINK_DOMAIN_RECOVERED = (
        "nvlink_domain_recovered",
        "the suspected NVLink domain's nodes all report clean again: resumed together",
    )
    BLAST_RADIUS_CAP = (
        "blast_radius_cap",
        "a switch/partition/cluster node-drain cap ([blast_radius]) is reached: no new node "
        "drain in that scope",
    )
    REMEDIATION = (
        "remediation",
        "a rung of the remediation ladder (reset, reboot, inspect) or the lemon ledger's verdict",
    )


NoRule = Literal[""]  # a resolve_alert: nothing fired
_RULES: dict[object, Rule] = {str(r): r for r in Rule}


def rule_named(name: object) -> Rule | None:
    """The rule of that name, None for none (a row of an older version may name a rule that
    no longer exists)."""
    return _RULES.get(name)


def rule_description(name: str | None) -> str:
    """What a rule means, for people reading actions and decisions ("" for no/unknown rule)."""
    rule = rule_named(name)
    return "" if rule is None else rule.description
