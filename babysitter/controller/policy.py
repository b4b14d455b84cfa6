"""Policy: pure functions from facts to a verdict per node and a list of decisions, each
carrying the rule that fired. No I/O here; facts.py gathers the facts, remediation.py applies
the decisions and executor.py executes them through Slurm.

Rules are data (RULES below) so a site can read them in one place: every decision names a
rule of RULES (checked when the decision is made), and the API shows the rule's description
beside every action it caused. Facts hold `Finding`s, severities are `Severity` and their order
is `Severity`'s own (finding.py); there is no second order here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal, get_args

from babysitter.finding import Action, Finding, Severity

if TYPE_CHECKING:
    from babysitter.config import Config

# Marks the drains `babysitter check --slurm-drain` (the HealthCheckProgram mode) makes:
# reason `<prefix> [healthcheck] <check>: <message>`. The check resumes only drains carrying
# it; the controller resumes only its own (no mark). Each mode owns what it drained.
HEALTHCHECK_MARK = "[healthcheck]"
# Marks an admin's drain through the controller (API/CLI, rule `manual`): reason
# `<prefix> [manual] <reason>`. It belongs to the admin: the policy never resumes it and no
# remediation rung runs on it; `babysitter resume` returns it.
MANUAL_MARK = "[manual]"

# Actions that mean "this node must not run jobs"
DRAIN_ACTIONS = frozenset({Action.DRAIN, Action.RESET_GPU, Action.REBOOT})
FATAL_XID_CLASSES = frozenset({Action.REBOOT, Action.RESET_GPU})


# The names a decision may carry: a misspelled one is a mypy error where the decision is made
# (and a ValueError at run time, see Decision); RULES below describes each one.
RuleName = Literal[
    "critical_finding",
    "drain_action",
    "warning_suspect",
    "heartbeat_missing",
    "fault_cleared",
    "not_ours",
    "guard_fraction",
    "guard_unknown",
    "job_owned_finding",
    "guard_rate",
    "guard_tripped",
    "xid_escalation",
    "lemon_node",
    "validate_before_resume",
    "validation_exhausted",
    "node_slow",
    "job_on_failed_node",
    "manual",
    "switch_suspected",
    "switch_recovered",
    "blast_radius_cap",
    "remediation",
]
NoRule = Literal[""]  # a resolve_alert: nothing fired


@dataclass(frozen=True)
class Rule:
    name: RuleName
    description: str


RULES: dict[RuleName, Rule] = {
    "critical_finding": Rule("critical_finding", "a critical finding drains the node"),
    "drain_action": Rule(
        "drain_action", "a warning whose recommended action is drain/reset/reboot drains"
    ),
    "warning_suspect": Rule("warning_suspect", "warnings make the node suspect (alert only)"),
    "heartbeat_missing": Rule("heartbeat_missing", "no report within the heartbeat timeout"),
    "fault_cleared": Rule(
        "fault_cleared", "fault gone and resume_after_clean_checks clean reports: resume"
    ),
    "not_ours": Rule("not_ours", "drained/down for someone else: never touched, only alerted"),
    "guard_fraction": Rule(
        "guard_fraction",
        "more than max(min_drainable, max_drained_fraction x size) of a partition drained",
    ),
    "guard_unknown": Rule(
        "guard_unknown", "partition sizes unknown (no Slurm data): no drain decided, alert"
    ),
    "job_owned_finding": Rule(
        "job_owned_finding",
        "a finding derived from a job's own output (job logs) never drains a node on its own: "
        "alert naming the job",
    ),
    "guard_rate": Rule("guard_rate", "max_drains_per_hour reached"),
    "guard_tripped": Rule("guard_tripped", "breaker tripped earlier; needs an admin reset"),
    "xid_escalation": Rule(
        "xid_escalation", "same fatal XID >= 5 times in 24 h on one GPU: hardware inspection"
    ),
    "lemon_node": Rule("lemon_node", "drained >= 3 times in 7 days: lemon node"),
    "validate_before_resume": Rule(
        "validate_before_resume",
        "fault gone: a validation job must pass on the node before it returns (if enabled)",
    ),
    "validation_exhausted": Rule(
        "validation_exhausted", "validation failed max_attempts times: stays drained for an admin"
    ),
    "node_slow": Rule(
        "node_slow",
        "throughput below the fleet median of its GPU model in consecutive measurements",
    ),
    # rules of actions that are not the node policy's own decisions
    "job_on_failed_node": Rule(
        "job_on_failed_node",
        "a babysat job on a drained or DOWN node is requeued from its last checkpoint",
    ),
    "manual": Rule("manual", "requested by an admin (API or CLI)"),
    # controller/fabric.py and controller/blast.py
    "switch_suspected": Rule(
        "switch_suspected",
        "fabric faults on fabric.min_nodes (or half) of a switch's nodes within "
        "fabric.window_s: one switch incident, its nodes drained together (or kept)",
    ),
    "switch_recovered": Rule(
        "switch_recovered",
        "the suspected switch's nodes all report clean again: resumed together",
    ),
    "blast_radius_cap": Rule(
        "blast_radius_cap",
        "a switch/partition/cluster node-drain cap ([blast_radius]) is reached: no new node "
        "drain in that scope",
    ),
    "remediation": Rule(
        "remediation",
        "a rung of the remediation ladder (reset, reboot, inspect) or the lemon ledger's verdict",
    ),
}


if set(RULES) != set(get_args(RuleName)) or any(k != r.name for k, r in RULES.items()):
    raise AssertionError("RULES must describe exactly the names of RuleName")


def rule_description(name: str | None) -> str:
    """What a rule means, for people reading actions and decisions ("" for no/unknown rule:
    rows written by an older version may name a rule that no longer exists)."""
    for key, rule in RULES.items():
        if key == name:
            return rule.description
    return ""


XID_ESCALATION_COUNT = 5
XID_ESCALATION_WINDOW = timedelta(hours=24)
LEMON_DRAINS = 3
LEMON_WINDOW = timedelta(days=7)


@dataclass(frozen=True)
class PolicySettings:
    dry_run: bool = False
    max_drained_fraction: float = 0.1
    min_drainable: int = 1
    max_drains_per_hour: int = 20
    resume_after_clean_checks: int = 3
    heartbeat_timeout_s: float = 120.0
    validate_before_resume: bool = False
    validation_max_attempts: int = 3

    @classmethod
    def from_config(cls, cfg: Config) -> PolicySettings:
        return cls(
            dry_run=cfg.policy.dry_run,
            max_drained_fraction=cfg.policy.max_drained_fraction,
            min_drainable=cfg.policy.min_drainable,
            max_drains_per_hour=cfg.policy.max_drains_per_hour,
            resume_after_clean_checks=cfg.policy.resume_after_clean_checks,
            heartbeat_timeout_s=cfg.controller.heartbeat_timeout_s,
            validate_before_resume=cfg.validation.enabled(cfg.policy),
            validation_max_attempts=cfg.validation.max_attempts,
        )


@dataclass(frozen=True)
class NodeFacts:
    name: str
    open_findings: tuple[Finding, ...] = ()
    consecutive_clean: int = 0
    heartbeat_age_s: float | None = None
    partitions: tuple[str, ...] = ("default",)
    drained: bool = False  # Slurm shows DRAIN (or DOWN) on it
    reason: str = ""
    ours: bool = False  # the reason is babysitter's (or a dry-run drain of ours)
    in_slurm: bool = True
    drain_pending: bool = False  # a drain action is already queued
    recent_drains: tuple[datetime, ...] = ()  # babysitter drains of this node
    xid_history: tuple[tuple[str, int, datetime], ...] = ()  # (component, xid, when)
    validation: str = ""  # latest validation since the last fault drain: running passed failed
    validation_failures: int = 0


@dataclass(frozen=True)
class ClusterFacts:
    # empty = unknown (Slurm never read): the guard cannot size anything and decides no drain
    partition_sizes: dict[str, int] = field(default_factory=dict)
    drained_by_us: dict[str, int] = field(default_factory=dict)
    drains_last_hour: int = 0
    guard_tripped: bool = False


@dataclass(frozen=True)
class Decision:
    kind: str  # drain resume validate alert keep_alert resolve_alert escalate guard_tripped
    node: str | None
    rule: RuleName | NoRule  # "" only for resolve_alert
    reason: str
    severity: Severity = Severity.WARNING
    condition: str = ""
    dry_run: bool = False
    details: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a rule name nobody can look up is a bug here, not something to show an admin
        if self.rule not in RULES and not (self.rule == "" and self.kind == "resolve_alert"):
            raise ValueError(f"decision {self.kind} names rule {self.rule!r}, not one of RULES")
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


# Checks whose findings come from content a job's owner controls (its log files): they say
# something about the job, not the node, so they never drain a node on their own.
JOB_OWNED_CHECKS = frozenset({"nccl.logs"})


def job_owned(f: Finding) -> bool:
    return f.check in JOB_OWNED_CHECKS or f.component.startswith("job:")


def drain_worthy(f: Finding) -> bool:
    if job_owned(f):
        return False
    sev = f.severity
    return sev is Severity.CRITICAL or (sev is Severity.WARNING and f.action in DRAIN_ACTIONS)


def drain_limit(size: int, s: PolicySettings) -> float:
    """Nodes of a partition of `size` babysitter may hold drained: the fraction, but never
    fewer than min_drainable (so the first fault in a small partition is drained)."""
    return max(float(s.min_drainable), s.max_drained_fraction * size)


def summary(findings: Sequence[Finding]) -> str:
    """`<check>: <message>` of the worst finding, for drain reasons and alert titles."""
    worst = max(findings, key=lambda f: f.severity.rank)
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return f"{worst.check}: {worst.message}{more}"


def node_verdict(
    open_findings: Sequence[Finding], heartbeat_age_s: float | None, heartbeat_timeout_s: float
) -> tuple[str, RuleName | NoRule]:
    """THE verdict of a node (healthy suspect unhealthy unknown) and the rule that gave it;
    the policy and the API's node view both call this, so they cannot disagree."""
    if heartbeat_age_s is None or heartbeat_age_s > heartbeat_timeout_s:
        return "unknown", "heartbeat_missing"
    node_owned = [f.severity for f in open_findings if not job_owned(f)]
    worst = max(node_owned, default=Severity.OK, key=lambda s: s.rank)
    if any(drain_worthy(f) for f in open_findings):
        return "unhealthy", ("critical_finding" if worst is Severity.CRITICAL else "drain_action")
    if worst >= Severity.WARNING:
        return "suspect", "warning_suspect"
    return "healthy", ""


def facts_verdict(n: NodeFacts, s: PolicySettings) -> tuple[str, RuleName | NoRule]:
    return node_verdict(n.open_findings, n.heartbeat_age_s, s.heartbeat_timeout_s)


def _escalations(n: NodeFacts, now: datetime) -> list[Decision]:
    out: list[Decision] = []
    counts: dict[tuple[str, int], int] = {}
    for comp, xid, when in n.xid_history:
        if now - when <= XID_ESCALATION_WINDOW:
            counts[(comp, xid)] = counts.get((comp, xid), 0) + 1
    for (comp, xid), c in sorted(counts.items()):
        if c >= XID_ESCALATION_COUNT:
            out.append(
                Decision(
                    "escalate",
                    n.name,
                    "xid_escalation",
                    f"XID {xid} seen {c} times in 24 h on {comp}: needs hardware inspection",
                    Severity.CRITICAL,
                    f"xid_{xid}_repeated",
                    details={"component": comp, "count": c},
                )
            )
    drains = [d for d in n.recent_drains if now - d <= LEMON_WINDOW]
    if len(drains) >= LEMON_DRAINS:
        out.append(
            Decision(
                "escalate",
                n.name,
                "lemon_node",
                f"{n.name} was drained {len(drains)} times in 7 days: lemon node, consider RMA",
                Severity.WARNING,
                "lemon_node",
                details={"drains_7d": len(drains)},
            )
        )
    return out


JOB_ALERT_PREFIX = "job_log_"


def _job_owned_alerts(n: NodeFacts) -> list[Decision]:
    """Findings from a job's own output: an alert that names the job, never a node drain."""
    out: list[Decision] = []
    seen: set[str] = set()
    for f in n.open_findings:
        if not job_owned(f) or f.severity < Severity.WARNING:
            continue
        job = str(f.details.get("job_id") or f.component.removeprefix("job:"))
        job = "".join(c for c in job if c.isascii() and c.isalnum())[:32] or "unknown"
        if job in seen:
            continue
        seen.add(job)
        out.append(
            Decision(
                "alert",
                n.name,
                "job_owned_finding",
                f"job {job} on {n.name}: {f.check}: {f.message} (from the job's "
                "own log: the node is not drained for this alone)",
                Severity.WARNING,
                f"{JOB_ALERT_PREFIX}{job}",
                details={"job_id": job, "code": f.code},
            )
        )
    return out


def _return_to_service(n: NodeFacts, s: PolicySettings) -> list[Decision]:
    """The fault is gone: resume, or first prove the node with a validation job."""
    cleared = f"fault gone, {n.consecutive_clean} clean reports"
    if not s.validate_before_resume or n.validation == "passed":
        return [
            Decision(
                "resume",
                n.name,
                "fault_cleared",
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
                "escalate",
                n.name,
                "validation_exhausted",
                f"{n.name} failed validation {n.validation_failures} times: needs an admin",
                Severity.CRITICAL,
                "validation_lemon",
            )
        ]
    return [
        Decision(
            "validate",
            n.name,
            "validate_before_resume",
            f"{cleared}: validation job before it returns",
            Severity.INFO,
            "node_unhealthy",
            dry_run=s.dry_run,
        )
    ]


def decide(
    nodes: Sequence[NodeFacts],
    cluster: ClusterFacts,
    s: PolicySettings,
    now: datetime,
    admit: Callable[[NodeFacts], bool] | None = None,
) -> PolicyResult:
    """Decide for every node at once so the blast-radius guard applies in a deterministic
    order: the most severe nodes first, then by name. `admit`: the scoped node-drain caps
    (controller/blast.py), asked before the cluster-wide breaker; a drain it refuses is held
    in its scope only."""
    verdicts: dict[str, str] = {}
    decisions: list[Decision] = []
    want_drain: list[tuple[int, NodeFacts, RuleName | NoRule, str]] = []
    for n in nodes:
        verdict, rule = facts_verdict(n, s)
        verdicts[n.name] = verdict
        decisions.extend(_escalations(n, now))
        decisions.extend(_job_owned_alerts(n))
        bad = [f for f in n.open_findings if drain_worthy(f)]
        if verdict == "unknown" and n.heartbeat_age_s is not None:
            decisions.append(
                Decision(
                    "alert",
                    n.name,
                    "heartbeat_missing",
                    f"no report from {n.name} for {n.heartbeat_age_s:.0f} s",
                    Severity.WARNING,
                    "node_unknown",
                )
            )
        elif verdict != "unknown":
            decisions.append(Decision("resolve_alert", n.name, "", "", condition="node_unknown"))
        if bad and verdict == "unhealthy":
            if n.drained and not n.ours:
                decisions.append(
                    Decision(
                        "alert",
                        n.name,
                        "not_ours",
                        f"{summary(bad)} — node is held by someone else ({n.reason!r}); "
                        "babysitter left it alone",
                        Severity.WARNING,
                        "node_unhealthy_not_ours",
                    )
                )
            elif not n.drained and not n.drain_pending and n.in_slurm:
                worst = max(f.severity.rank for f in bad)
                want_drain.append((worst, n, rule, summary(bad)))
            else:
                # drained (or about to be) by babysitter and still broken: the alert still
                # holds; re-asserting it each tick keeps it alive where alerts expire
                decisions.append(
                    Decision(
                        "keep_alert",
                        n.name,
                        rule,
                        summary(bad),
                        Severity.CRITICAL,
                        "node_unhealthy",
                        dry_run=s.dry_run,
                    )
                )
            continue
        decisions.append(
            Decision("resolve_alert", n.name, "", "", condition="node_unhealthy_not_ours")
        )
        if (
            n.drained
            and n.ours
            and verdict in ("healthy", "suspect")
            and not bad
            and n.consecutive_clean >= s.resume_after_clean_checks
        ):
            decisions.extend(_return_to_service(n, s))

    # blast-radius guard
    tripped = cluster.guard_tripped
    drained = dict(cluster.drained_by_us)
    drains_hour = cluster.drains_last_hour
    blocked: list[str] = []
    unsized: list[str] = []
    guard_rule: RuleName | NoRule = "guard_tripped" if tripped else ""
    for _, n, rule, why in sorted(want_drain, key=lambda t: (-t[0], t[1].name)):
        if any(p not in cluster.partition_sizes for p in n.partitions):
            # never trip on a size we do not know: hold the drain and say so
            unsized.append(n.name)
            continue
        if admit is not None and not admit(n):
            continue
        if not tripped:
            over_rate = drains_hour + 1 > s.max_drains_per_hour
            over_frac = any(
                drained.get(p, 0) + 1 > drain_limit(cluster.partition_sizes[p], s)
                for p in n.partitions
            )
            if over_rate or over_frac:
                tripped = True
                guard_rule = "guard_rate" if over_rate else "guard_fraction"
        if tripped:
            blocked.append(n.name)
            continue
        decisions.append(
            Decision(
                "drain", n.name, rule, why, Severity.CRITICAL, "node_unhealthy", dry_run=s.dry_run
            )
        )
        drains_hour += 1
        for p in n.partitions:
            drained[p] = drained.get(p, 0) + 1
    if tripped and not blocked:
        decisions.append(
            Decision(
                "keep_alert",
                None,
                "guard_tripped",
                "blast-radius guard tripped earlier: drains stay stopped until an admin reset",
                Severity.CRITICAL,
                "guard_tripped",
            )
        )
    if blocked:
        decisions.append(
            Decision(
                "guard_tripped",
                None,
                guard_rule,
                f"blast-radius guard: {len(blocked)} unhealthy node(s) NOT drained "
                f"({', '.join(blocked[:10])}{'…' if len(blocked) > 10 else ''}); "
                f"limits: {s.max_drained_fraction:.0%} of a partition (at least "
                f"{s.min_drainable} node(s)), {s.max_drains_per_hour}/h",
                Severity.CRITICAL,
                "guard_tripped",
                details={"blocked": blocked},
            )
        )
    if unsized:
        decisions.append(
            Decision(
                "alert",
                None,
                "guard_unknown",
                f"{len(unsized)} unhealthy node(s) NOT drained "
                f"({', '.join(unsized[:10])}{'…' if len(unsized) > 10 else ''}): partition "
                "sizes unknown (no Slurm data yet); babysitter decides once Slurm answers",
                Severity.CRITICAL,
                "guard_sizes_unknown",
                details={"blocked": unsized},
            )
        )
    else:
        decisions.append(Decision("resolve_alert", None, "", "", condition="guard_sizes_unknown"))
    return PolicyResult(verdicts, decisions, tripped)
