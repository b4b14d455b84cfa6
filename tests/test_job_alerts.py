"""Job-owned findings page once per job, and a node whose job-log scoping failed is visible
without being drained (issue 42)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from babysitter.controller.loop.decide.node.decisions import DecisionKind
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.node.policy import decide
from babysitter.finding import Finding
from tests.test_admission import Site, disk

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)

NODES = ("node1", "node2", "node3", "node4")


def nccl_line(node: str, job: str = "4242") -> Finding:
    """What each node of a multi-node job reports: the same line of the shared slurm-<id>.out."""
    return Finding(
        check="nccl.logs",
        component=f"job:{job}",
        severity="critical",
        code="nccl.transport_error",
        message=f"job {job} on {node}: transport retry counter exceeded",
        action="requeue_job",
        details={"node": node, "job_id": job},
    )


def skipped() -> Finding:
    return Finding(
        check="nccl.logs",
        component="host",
        severity="warning",
        code="nccl.logs_skipped",
        message="job logs not read: the jobs running on this node are unknown",
    )


def facts(name: str, *findings: Finding, **kw: Any) -> NodeFacts:
    return NodeFacts(
        name=name, open_findings=findings, heartbeat_age_s=5.0, partitions=("gpu",), **kw
    )


def alerts(decisions: list[Any]) -> list[Any]:
    return [d for d in decisions if d.kind is DecisionKind.ALERT]


def test_four_nodes_of_one_job_reporting_one_line_are_one_alert_naming_them():
    """Every node of a job reads the shared log: one line was 4 pages, `job_log_4242` on
    each node. Now one alert keyed by the job, naming the 4 nodes; nothing drained."""
    nodes = [facts(n, nccl_line(n)) for n in reversed(NODES)]
    res = decide(nodes, ClusterFacts({"gpu": 4}), PolicySettings(), NOW)
    [a] = alerts(res.decisions)
    assert (a.node, a.condition) == (None, "job_log_4242")
    assert a.nodes == NODES and all(n in a.reason for n in NODES)
    assert not [d for d in res.decisions if d.kind is DecisionKind.DRAIN]
    # two jobs: two alerts, each with its own nodes
    nodes.append(facts("node5", nccl_line("node5", "77")))
    res = decide(nodes, ClusterFacts({"gpu": 5}), PolicySettings(), NOW)
    assert sorted((a.condition, a.nodes) for a in alerts(res.decisions)) == [
        ("job_log_4242", NODES),
        ("job_log_77", ("node5",)),
    ]


def test_one_job_alert_through_the_engine(tmp_path):
    """The same through the real engine and alert router: one firing alert for the job."""
    site = Site(tmp_path, dict.fromkeys(NODES, "gpu"))
    try:
        site.tick()
        site.report({n: (nccl_line(n),) for n in NODES})
        site.tick()
        assert site.engine.sender.flush()
        firing = [a for a in site.store.alerts() if a["state"] == "firing"]
        job = [a for a in firing if a["condition"].startswith("job_log_")]
        assert [(a["node"], a["condition"]) for a in job] == [(None, "job_log_4242")], job
        assert site.drained() == []
    finally:
        site.close()


def test_a_job_alert_names_its_owner_from_the_job_listing(tmp_path):
    """A job alert goes to the job's owner: its Slurm user, read from the job listing the
    controller already reads (no Slurm call per alert), as the `owner` label and in the
    webhook's payload; the resolved alert carries the same label, so Alertmanager ends the
    firing one."""
    from babysitter.controller.loop.record.alerts.sinks import AlertmanagerSink, WebhookSink
    from babysitter.slurm.client import SlurmJob

    site = Site(tmp_path, dict.fromkeys(NODES, "gpu"))
    try:
        site.slurm.add_job(SlurmJob(4242, name="train", states=("RUNNING",), user="alice"))
        site.tick()
        site.report({n: (nccl_line(n),) for n in NODES})
        site.tick()
        [fired] = [a for a in site.engine.router.sent if a.condition == "job_log_4242"]
        assert fired.owner == "alice" and "Job owner: alice" in fired.text()
        labels = AlertmanagerSink("http://am.invalid").payload(fired)[0]["labels"]
        assert (labels["route"], labels["job_id"], labels["owner"]) == ("job", "4242", "alice")
        assert WebhookSink("http://hook.invalid").payload(fired)["owner"] == "alice"
        site.report({n: () for n in NODES})  # the line is no longer open: the alert resolves
        site.tick()
        [resolved] = [a for a in site.engine.router.sent if a.resolved]
        assert (resolved.condition, resolved.owner) == ("job_log_4242", "alice")
        # an on-call alert has no owner
        assert all(a.owner is None for a in site.engine.router.sent if a.route == "oncall")
    finally:
        site.close()


def test_a_node_whose_job_logs_went_unread_is_suspect_never_drained_nor_a_job_alert():
    """`nccl.logs_skipped` (the job list unknown: the job-log check read nothing) was info and
    dropped by the controller: the node was silent. Now a node-level warning: the node is
    suspect, not drained, and it is no job's alert (it was filed as job `host`)."""
    res = decide([facts("node1", skipped())], ClusterFacts({"gpu": 4}), PolicySettings(), NOW)
    assert res.verdicts["node1"] == "suspect"
    assert not [d for d in res.decisions if d.kind is DecisionKind.DRAIN]
    assert not [a for a in alerts(res.decisions) if a.condition.startswith("job_log_")]


def test_an_unread_job_log_does_not_keep_a_drained_node_from_its_resume(tmp_path):
    """Decided: it is a job-log check only, the node's own hardware checks still ran, so a
    report with it counts as clean towards the resume (not unknown)."""
    site = Site(
        tmp_path,
        dict.fromkeys(NODES, "gpu"),
        policy={"validate_before_resume": False, "resume_after_clean_checks": 2},
    )
    try:
        site.tick()
        site.report({"node1": (disk("node1"),)})
        site.tick()
        assert site.drained() == ["node1"]
        for _ in range(3):
            site.now += timedelta(seconds=1)
            site.report({"node1": (skipped(),)})
            site.tick()
        assert site.drained() == []
        row = site.store.node("node1")
        assert row is not None and [f.code for f in row["open_findings"]] == ["nccl.logs_skipped"]
    finally:
        site.close()
