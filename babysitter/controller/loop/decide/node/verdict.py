"""A node's verdict (healthy suspect unhealthy unknown) and which findings may drain a node:
one predicate for the policy, the API's node view, ingest and the steps, so they cannot
disagree. Severities order by `Severity`'s own rank (finding.py); there is no second order."""

from __future__ import annotations

from collections.abc import Sequence

from babysitter.controller.loop.decide.node.facts_model import NodeFacts, PolicySettings
from babysitter.controller.loop.decide.node.rules import NoRule, Rule
from babysitter.finding import Action, Finding, Severity, job_owned

# Actions that mean "this node must not run jobs"
DRAIN_ACTIONS = frozenset({Action.DRAIN, Action.RESET_GPU, Action.REBOOT})
FATAL_XID_CLASSES = frozenset({Action.REBOOT, Action.RESET_GPU})


# job_owned (finding.py, one predicate for the whole controller): findings from content a
# job's owner controls say something about the job, never drain a node on their own


def drain_worthy(f: Finding) -> bool:
    # the severity first: most findings are OK and job_owned's string tests are the dearer
    sev = f.severity
    if sev is Severity.CRITICAL or (sev is Severity.WARNING and f.action in DRAIN_ACTIONS):
        return not job_owned(f)
    return False


def node_verdict(
    open_findings: Sequence[Finding], heartbeat_age_s: float | None, heartbeat_timeout_s: float
) -> tuple[str, Rule | NoRule]:
    """THE verdict of a node (healthy suspect unhealthy unknown) and the rule that gave it;
    the policy and the API's node view both call this, so they cannot disagree."""
    if heartbeat_age_s is None or heartbeat_age_s > heartbeat_timeout_s:
        return "unknown", Rule.HEARTBEAT_MISSING
    node_owned = [f.severity for f in open_findings if not job_owned(f)]
    worst = max(node_owned, default=Severity.OK, key=lambda s: s.rank)
    if any(drain_worthy(f) for f in open_findings):
        critical = worst is Severity.CRITICAL
        return "unhealthy", (Rule.CRITICAL_FINDING if critical else Rule.DRAIN_ACTION)
    if worst >= Severity.WARNING:
        return "suspect", Rule.WARNING_SUSPECT
    return "healthy", ""


def facts_verdict(n: NodeFacts, s: PolicySettings) -> tuple[str, Rule | NoRule]:
    return node_verdict(n.open_findings, n.heartbeat_age_s, s.heartbeat_timeout_s)
