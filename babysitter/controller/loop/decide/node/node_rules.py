"""The per-node rules: one node's facts and verdict in, its decisions out (escalations, the
heartbeat alert, an alert or a drain wish for a broken node, the return to service). A drain
is only wished here: the blast-radius guard (drain_guard.py) decides which are made."""

from __future__ import annotations

from datetime import datetime, timedelta

from babysitter.controller.db.validation_state import validated_for_this_drain
from babysitter.controller.loop.decide.node.decisions import Decision, DecisionKind
from babysitter.controller.loop.decide.node.drain_guard import DrainWish
from babysitter.controller.loop.decide.node.facts_model import NodeFacts, PolicySettings
from babysitter.controller.loop.decide.node.rules import NoRule, Rule
from babysitter.controller.loop.decide.node.verdict import drain_worthy
from babysitter.controller.loop.decide.node.wording import summary
from babysitter.finding import Finding, Severity, no_verdict

# one XID on one GPU seen again within this is the same event (the escalation counts events)
SAME_EVENT = timedelta(seconds=60)


def _escalations(n: NodeFacts, s: PolicySettings, now: datetime) -> list[Decision]:
    """The same fatal XID again and again on one GPU, or a node drained again and again (a
    lemon): a human looks."""
    out: list[Decision] = []
    counts: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], datetime] = {}
    for comp, xid, when in sorted(n.xid_history, key=lambda e: e[2]):
        # an event, not a finding row: the agent repeats a sticky XID in every report until
        # the reboot, and NVML and the kernel log both report most XIDs (seconds apart)
        if now - when <= s.xid_window and not (
            (seen := last.get((comp, xid))) is not None and when - seen < SAME_EVENT
        ):
            counts[(comp, xid)] = counts.get((comp, xid), 0) + 1
            last[(comp, xid)] = when
    for (comp, xid), c in sorted(counts.items()):
        if c >= s.xid_escalation_count:
            out.append(
                Decision(
                    DecisionKind.ESCALATE,
                    n.name,
                    Rule.XID_ESCALATION,
                    f"XID {xid} seen {c} times in {s.xid_escalation_window_h:g} h on {comp}: "
                    "needs hardware inspection",
                    Severity.CRITICAL,
                    f"xid_{xid}_repeated",
                    details={"component": comp, "count": c},
                )
            )
    drains = [d for d in n.recent_drains if now - d <= s.lemon_window]
    if len(drains) >= s.lemon_drains:
        out.append(
            Decision(
                DecisionKind.ESCALATE,
                n.name,
                Rule.LEMON_NODE,
                f"{n.name} was drained {len(drains)} times in {s.lemon_window_days:g} days: "
                "lemon node, consider RMA",
                Severity.WARNING,
                "lemon_node",
                details={"drains_7d": len(drains)},
            )
        )
    return out


def _return_to_service(n: NodeFacts, s: PolicySettings) -> list[Decision]:
    """The fault is gone: resume, or first prove the node with a validation job."""
    cleared = f"fault gone, {n.consecutive_clean} clean reports"
    if not s.validate_before_resume or validated_for_this_drain(n.validation):
        return [
            Decision(
                DecisionKind.RESUME,
                n.name,
                Rule.FAULT_CLEARED,
                cleared,
                Severity.INFO,
                "node_unhealthy",
                dry_run=s.dry_run,
            )
        ]
    if n.validation == "running":
        return []
    if n.validation_failures >= s.validation_max_attempts:
        return [
            Decision(
                DecisionKind.ESCALATE,
                n.name,
                Rule.VALIDATION_EXHAUSTED,
                f"{n.name} failed validation {n.validation_failures} times: needs an admin",
                Severity.CRITICAL,
                "validation_lemon",
            )
        ]
    return [
        Decision(
            DecisionKind.VALIDATE,
            n.name,
            Rule.VALIDATE_BEFORE_RESUME,
            f"{cleared}: validation job before it returns",
            Severity.INFO,
            "node_unhealthy",
            dry_run=s.dry_run,
        )
    ]


def _heartbeat(n: NodeFacts, verdict: str) -> list[Decision]:
    """Alert on a node that stopped reporting; clear that alert once it reports again."""
    if verdict == "unknown" and n.heartbeat_age_s is not None:
        return [
            Decision(
                DecisionKind.ALERT,
                n.name,
                Rule.HEARTBEAT_MISSING,
                f"no report from {n.name} for {n.heartbeat_age_s:.0f} s",
                Severity.WARNING,
                "node_unknown",
            )
        ]
    if verdict != "unknown":
        return [Decision(DecisionKind.RESOLVE_ALERT, n.name, "", "", condition="node_unknown")]
    return []


def _unhealthy(
    n: NodeFacts, rule: Rule | NoRule, bad: list[Finding], s: PolicySettings
) -> Decision | DrainWish:
    """A broken node: a drain to ask the guard for, or an alert when it is not ours to drain
    or already drained (or about to be) by babysitter."""
    if not n.in_slurm:
        # Slurm does not list the node: nothing was drained, nothing can be; say that
        return Decision(
            DecisionKind.ALERT,
            n.name,
            rule,
            f"{summary(bad)} — {n.name} is unknown to Slurm: not drained",
            Severity.CRITICAL,
            "node_unhealthy_not_in_slurm",
        )
    if n.drained and not n.ours:
        return Decision(
            DecisionKind.ALERT,
            n.name,
            Rule.NOT_OURS,
            f"{summary(bad)} — node is held by someone else ({n.reason!r}); "
            "babysitter left it alone",
            Severity.WARNING,
            "node_unhealthy_not_ours",
        )
    if not n.drained and not n.drain_pending and n.in_slurm:
        return DrainWish(max(f.severity.rank for f in bad), n, rule, summary(bad))
    # drained (or about to be) by babysitter and still broken: the alert still holds;
    # re-asserting it each tick keeps it alive where alerts expire
    return Decision(
        DecisionKind.KEEP_ALERT,
        n.name,
        rule,
        summary(bad),
        Severity.CRITICAL,
        "node_unhealthy",
        dry_run=s.dry_run,
    )


def node_decisions(
    n: NodeFacts,
    verdict: str,
    rule: Rule | NoRule,
    s: PolicySettings,
    now: datetime,
    wishes: list[DrainWish],
) -> list[Decision]:
    """One node's decisions; a drain it needs goes to `wishes`, for the guard."""
    out = _escalations(n, s, now) + _heartbeat(n, verdict)
    bad = [f for f in n.open_findings if drain_worthy(f)]
    if bad and verdict == "unhealthy":
        step = _unhealthy(n, rule, bad, s)
        if isinstance(step, DrainWish):
            wishes.append(step)
        else:
            out.append(step)
        return out
    out.append(
        Decision(DecisionKind.RESOLVE_ALERT, n.name, "", "", condition="node_unhealthy_not_ours")
    )
    out.append(
        Decision(
            DecisionKind.RESOLVE_ALERT, n.name, "", "", condition="node_unhealthy_not_in_slurm"
        )
    )
    if (
        n.drained
        and n.ours
        and verdict in ("healthy", "suspect")
        and not bad
        and n.consecutive_clean >= s.resume_after_clean_checks
        # a crashed check, a timeout, an unreadable source said nothing about the node: never
        # a return while one is open, whatever streak the facts carry (not ingest's job alone)
        and not any(map(no_verdict, n.open_findings))
    ):
        out.extend(_return_to_service(n, s))
    return out
