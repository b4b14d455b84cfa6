"""Findings from a job's own output (job logs): one alert per job, never a node drain."""

from __future__ import annotations

from collections.abc import Sequence

from babysitter.controller.loop.decide.node.decisions import Decision, DecisionKind
from babysitter.controller.loop.decide.node.facts_model import NodeFacts
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.decide.node.wording import listed
from babysitter.finding import Finding, Severity, job_of, job_owned

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
                f"job {job} on {listed(names)}: {f.check}: {f.message} (from the job's own "
                "log: its nodes are not drained for this alone)",
                Severity.WARNING,
                f"{JOB_ALERT_PREFIX}{job}",
                details={"job_id": job, "code": f.code, "nodes": names[:50]},
                nodes=tuple(names),
            )
        )
    return out
