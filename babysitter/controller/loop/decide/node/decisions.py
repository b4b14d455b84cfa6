"""What the policy decides: a `Decision` per node (or for the cluster), each naming the `Rule`
that fired, and one tick's `PolicyResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from babysitter.controller.loop.decide.node.rules import NoRule, Rule, rule_description, rule_named
from babysitter.finding import Severity


class DecisionKind(StrEnum):
    """What the policy decided about a node (or the cluster); remediation turns the first three
    into actions (ActionKind) and the rest into alert traffic."""

    DRAIN = "drain"
    RESUME = "resume"
    VALIDATE = "validate"  # a validation job before the node returns
    ALERT = "alert"  # a new condition to page about
    KEEP_ALERT = "keep_alert"  # a condition still true: its alert stays firing
    RESOLVE_ALERT = "resolve_alert"  # a condition gone: its alert resolves
    ESCALATE = "escalate"  # the same XID again and again: a human looks
    GUARD_TRIPPED = "guard_tripped"  # the blast-radius breaker held this tick's drains


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    node: str | None
    rule: Rule | NoRule  # "" only for resolve_alert
    reason: str
    severity: Severity = Severity.WARNING
    condition: str = ""
    dry_run: bool = False
    details: dict[str, object] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()  # a cluster-wide alert's nodes (a job's alert: who reported it)

    def __post_init__(self) -> None:
        # a kind or rule name nobody can look up is a bug here, not something to show an admin
        object.__setattr__(self, "kind", DecisionKind(self.kind))
        if not (self.rule == "" and self.kind == "resolve_alert"):
            rule = rule_named(self.rule)
            if rule is None:
                raise ValueError(f"decision {self.kind} names rule {self.rule!r}, not one of Rule")
            object.__setattr__(self, "rule", rule)
        if not isinstance(self.severity, Severity):
            object.__setattr__(self, "severity", Severity(self.severity))

    @property
    def rule_description(self) -> str:
        return rule_description(self.rule)


@dataclass
class PolicyResult:
    verdicts: dict[str, str]
    decisions: list[Decision]
    guard_tripped: bool
