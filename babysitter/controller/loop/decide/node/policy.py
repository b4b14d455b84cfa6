"""Policy: pure functions from facts to a verdict per node and a list of decisions, each
carrying the rule that fired. No I/O here; facts.py gathers the facts, remediation.py applies
the decisions and executor.py executes them through Slurm.

Rules are data (`Rule`, rules.py) so a site can read them in one place: every decision names a
`Rule` (checked when the decision is made), and the API shows the rule's description beside
every action it caused. The pieces: facts_model.py (what is decided from), decisions.py (what
comes out), verdict.py (a node's verdict), node_rules.py (one node's decisions), job_alerts.py
(findings from a job's own output) and drain_guard.py (the blast-radius guard).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from babysitter.controller.loop.decide.node.decisions import Decision, PolicyResult
from babysitter.controller.loop.decide.node.drain_guard import DrainWish, Guard
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.node.job_alerts import job_owned_alerts
from babysitter.controller.loop.decide.node.node_rules import node_decisions
from babysitter.controller.loop.decide.node.verdict import facts_verdict


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
        decisions.extend(node_decisions(n, verdict, rule, s, now, wishes))
    decisions.extend(job_owned_alerts(nodes))
    guard = Guard(cluster, s)
    decisions.extend(guard.drains(wishes, admit))
    decisions.extend(guard.alerts())
    return PolicyResult(verdicts, decisions, guard.tripped)
