"""Policy: pure functions from facts to a verdict per node and a list of decisions, each
carrying the rule that fired. No I/O here; facts.py gathers the facts, remediation.py applies
the decisions and executor.py executes them through Slurm.

Rules are data (`Rule` below) so a site can read them in one place: every decision names a
`Rule` (checked when the decision is made), and the API shows the rule's description beside
every action it caused. Facts hold `Finding`s, severities are `Severity` and their order
is `Severity`'s own (finding.py); there is no second order here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from babysitter.controller.db.validation_state import validated_for_this_drain
from babysitter.finding import Action, Finding, Severity, job_of, job_owned, no_verdict

if TYPE_CHECKING:
    from babysitter.config import Config

# Actions that mean "this node must not run jobs"
DRAIN_ACTIONS = frozenset({Action.DRAIN, Action.RESET_GPU, Action.REBOOT})
FATAL_XID_CLASSES = frozenset({Action.REBOOT, Action.RESET_GPU})


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
    xid_escalation_count: int = 5
    xid_escalation_window_h: float = 24.0
    lemon_drains: int = 3
    lemon_window_days: float = 7.0

    @classmethod
    def from_config(cls, cfg: Config) -> PolicySettings:
        p = cfg.policy
        return cls(
            dry_run=p.dry_run,
            max_drained_fraction=p.max_drained_fraction,
            min_drainable=p.min_drainable,
            max_drains_per_hour=p.max_drains_per_hour,
            resume_after_clean_checks=p.resume_after_clean_checks,
            heartbeat_timeout_s=cfg.controller.heartbeat_timeout_s,
            validate_before_resume=cfg.validation.enabled(p),
            validation_max_attempts=cfg.validation.max_attempts,
            xid_escalation_count=p.xid_escalation_count,
            xid_escalation_window_h=p.xid_escalation_window_h,
            lemon_drains=p.lemon_drains,
            lemon_window_days=p.lemon_window_days,
        )

    @property
    def xid_window(self) -> timedelta:
        return timedelta(hours=self.xid_escalation_window_h)

    @property
    def lemon_window(self) -> timedelta:
        return timedelta(days=self.lemon_window_days)


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
    validation: str = ""  # latest validation since babysitter last drained it (db/episodes.py)
    validation_failures: int = 0


@dataclass(frozen=True)
class ClusterFacts:
    # empty = unknown (Slurm never read): the guard cannot size anything and decides no drain
    partition_sizes: dict[str, int] = field(default_factory=dict)
    drained_by_us: dict[str, int] = field(default_factory=dict)
    drains_last_hour: int = 0
    guard_tripped: bool = False


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


# job_owned (finding.py, one predicate for the whole controller): findings from content a
# job's owner controls say something about the job, never drain a node on their own


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


def _escalations(n: NodeFacts, s: PolicySettings, now: datetime) -> list[Decision]:
    out: list[Decision] = []
    counts: dict[tuple[str, int], int] = {}
    for comp, xid, when in n.xid_history:
        if now - when <= s.xid_window:
            counts[(comp, xid)] = counts.get((comp, xid), 0) + 1
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


JOB_ALERT_PREFIX = "job_log_"


def _job_lines(n: NodeFacts) -> dict[str, Finding]:
    """Per job, the first job-owned finding (warning or worse) this node reported for it."""
    out: dict[str, Finding] = {}
    for f in n.open_findings:
        if not job_owned(f) or f.severity < Severity.WARNING:
            continue
        out.setdefault(job_of(f), f)
    return out


def job_owned_alerts(nodes: Sequence[NodeFacts]) -> list[Decision]:
    """Findings from a job's own output: one alert per job (keyed by the job only: every node
    of a multi-node job reads the shared `slurm-<id>.out`, so one line came from N nodes and
    was N pages), naming the nodes that reported it; never a node drain."""
    by_job: dict[str, tuple[Finding, list[str]]] = {}
    for n in sorted(nodes, key=lambda n: n.name):
        for job, f in _job_lines(n).items():
            by_job.setdefault(job, (f, []))[1].append(n.name)
    out: list[Decision] = []
    for job, (f, names) in sorted(by_job.items()):
        out.append(
            Decision(
                DecisionKind.ALERT,
                None,
                Rule.JOB_OWNED_FINDING,
                f"job {job} on {_listed(names)}: {f.check}: {f.message} (from the job's own "
                "log: its nodes are not drained for this alone)",
                Severity.WARNING,
                f"{JOB_ALERT_PREFIX}{job}",
                details={"job_id": job, "code": f.code, "nodes": names[:50]},
                nodes=tuple(names),
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


@dataclass(frozen=True)
class DrainWish:
    """A node the policy would drain, before the blast-radius guard has had its say."""

    worst: int  # rank of its worst drain-worthy finding: the worst nodes are drained first
    node: NodeFacts
    rule: Rule | NoRule
    why: str


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


def _node_decisions(
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


def _listed(names: list[str]) -> str:
    return f"{', '.join(names[:10])}{'…' if len(names) > 10 else ''}"


@dataclass
class Guard:
    """The blast-radius guard over one tick's drain wishes: it admits drains in order until
    the hourly budget or a partition's share would be exceeded, then trips and holds the rest.
    Starts from the cluster's counts (drains already done, a breaker tripped earlier)."""

    cluster: ClusterFacts
    s: PolicySettings
    tripped: bool = False
    rule: Rule | NoRule = ""
    drained: dict[str, int] = field(default_factory=dict)
    drains_hour: int = 0
    blocked: list[str] = field(default_factory=list)
    unsized: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tripped = self.cluster.guard_tripped
        self.rule = Rule.GUARD_TRIPPED if self.tripped else ""
        self.drained = dict(self.cluster.drained_by_us)
        self.drains_hour = self.cluster.drains_last_hour

    def drains(
        self, wishes: list[DrainWish], admit: Callable[[NodeFacts], bool] | None
    ) -> list[Decision]:
        """The drains the guard admits: the most severe nodes first, then by name."""
        out: list[Decision] = []
        for w in sorted(wishes, key=lambda w: (-w.worst, w.node.name)):
            n = w.node
            if any(p not in self.cluster.partition_sizes for p in n.partitions):
                # never trip on a size we do not know: hold the drain and say so
                self.unsized.append(n.name)
                continue
            if admit is not None and not admit(n):
                continue
            if not self.tripped and (over := self._over(n)):
                self.tripped, self.rule = True, over
            if self.tripped:
                self.blocked.append(n.name)
                continue
            out.append(
                Decision(
                    DecisionKind.DRAIN,
                    n.name,
                    w.rule,
                    w.why,
                    Severity.CRITICAL,
                    "node_unhealthy",
                    dry_run=self.s.dry_run,
                )
            )
            self.drains_hour += 1
            for p in n.partitions:
                self.drained[p] = self.drained.get(p, 0) + 1
        return out

    def _over(self, n: NodeFacts) -> Rule | None:
        """The limit one more drain of `n` would exceed, if any."""
        if self.drains_hour + 1 > self.s.max_drains_per_hour:
            return Rule.GUARD_RATE
        sizes = self.cluster.partition_sizes
        if any(self.drained.get(p, 0) + 1 > drain_limit(sizes[p], self.s) for p in n.partitions):
            return Rule.GUARD_FRACTION
        return None

    def alerts(self) -> list[Decision]:
        """What the guard says: tripped earlier, tripped now (naming the held nodes), or
        holding drains because partition sizes are unknown."""
        s, out = self.s, []
        if self.tripped and not self.blocked:
            out.append(
                Decision(
                    DecisionKind.KEEP_ALERT,
                    None,
                    Rule.GUARD_TRIPPED,
                    "blast-radius guard tripped earlier: drains stay stopped until an admin reset",
                    Severity.CRITICAL,
                    "guard_tripped",
                )
            )
        if self.blocked:
            out.append(
                Decision(
                    DecisionKind.GUARD_TRIPPED,
                    None,
                    self.rule,
                    f"blast-radius guard: {len(self.blocked)} unhealthy node(s) NOT drained "
                    f"({_listed(self.blocked)}); "
                    f"limits: {s.max_drained_fraction:.0%} of a partition (at least "
                    f"{s.min_drainable} node(s)), {s.max_drains_per_hour}/h",
                    Severity.CRITICAL,
                    "guard_tripped",
                    details={"blocked": self.blocked},
                )
            )
        if not self.unsized:
            return [
                *out,
                Decision(DecisionKind.RESOLVE_ALERT, None, "", "", condition="guard_sizes_unknown"),
            ]
        out.append(
            Decision(
                DecisionKind.ALERT,
                None,
                Rule.GUARD_UNKNOWN,
                f"{len(self.unsized)} unhealthy node(s) NOT drained ({_listed(self.unsized)}): "
                "partition sizes unknown (no Slurm data yet); babysitter decides once Slurm "
                "answers",
                Severity.CRITICAL,
                "guard_sizes_unknown",
                details={"blocked": self.unsized},
            )
        )
        return out


def decide(
    nodes: Sequence[NodeFacts],
    cluster: ClusterFacts,
    s: PolicySettings,
    now: datetime,
    admit: Callable[[NodeFacts], bool] | None = None,
) -> PolicyResult:
    """Decide for every node at once so the blast-radius guard applies in a deterministic
    order: the most severe nodes first, then by name. `admit`: the scoped node-drain caps
    (loop/decide/blast.py), asked before the cluster-wide breaker; a drain it refuses is held
    in its scope only."""
    verdicts: dict[str, str] = {}
    decisions: list[Decision] = []
    wishes: list[DrainWish] = []
    for n in nodes:
        verdict, rule = facts_verdict(n, s)
        verdicts[n.name] = verdict
        decisions.extend(_node_decisions(n, verdict, rule, s, now, wishes))
    decisions.extend(job_owned_alerts(nodes))
    guard = Guard(cluster, s)
    decisions.extend(guard.drains(wishes, admit))
    decisions.extend(guard.alerts())
    return PolicyResult(verdicts, decisions, guard.tripped)
