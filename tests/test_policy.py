"""Policy is pure: facts in, verdicts and decisions out, with the rule that fired."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from babysitter.config import load_config
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.node.policy import decide
from babysitter.finding import Finding

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
DBE = {
    "check": "gpu.memory",
    "component": "gpu3",
    "severity": "critical",
    "code": "ecc.dbe.volatile",
    "message": "GPU 3: 1 volatile DBE",
    "action": "reset_gpu",
}
PCIE = {
    "check": "gpu.pcie",
    "component": "gpu2",
    "severity": "warning",
    "code": "pcie.width_degraded",
    "message": "x8 of x16",
    "action": "inspect",
}
S = PolicySettings(max_drained_fraction=0.5, max_drains_per_hour=20, resume_after_clean_checks=3)


def node(name, findings=(), **kw):
    kw.setdefault("heartbeat_age_s", 5.0)
    kw.setdefault("partitions", ("gpu",))
    return NodeFacts(name=name, open_findings=tuple(Finding.from_dict(f) for f in findings), **kw)


def cluster(n=4, **kw):
    return ClusterFacts(partition_sizes={"gpu": n}, **kw)


def kinds(res, kind):
    return [d for d in res.decisions if d.kind == kind]


def test_critical_finding_drains_with_rule_and_summary():
    res = decide([node("node2", [DBE]), node("node1")], cluster(), S, NOW)
    [d] = kinds(res, "drain")
    assert d.node == "node2" and d.rule == "critical_finding"
    assert d.reason == "gpu.memory: GPU 3: 1 volatile DBE"
    assert res.verdicts == {"node2": "unhealthy", "node1": "healthy"}


def test_warning_makes_suspect_without_drain():
    res = decide([node("node1", [PCIE])], cluster(), S, NOW)
    assert res.verdicts["node1"] == "suspect" and not kinds(res, "drain")


def test_admin_drained_node_is_never_drained_or_resumed_only_alerted():
    n = node("node3", [DBE], drained=True, reason="admin maintenance", ours=False)
    res = decide([n], cluster(), S, NOW)
    assert not kinds(res, "drain") and not kinds(res, "resume")
    [a] = kinds(res, "alert")
    assert a.rule == "not_ours" and "admin maintenance" in a.reason
    clean = node(
        "node3", [], drained=True, reason="admin maintenance", ours=False, consecutive_clean=10
    )
    assert not kinds(decide([clean], cluster(), S, NOW), "resume")


def test_resume_only_after_enough_clean_reports():
    ours = dict(drained=True, reason="babysitter: x", ours=True)
    assert not kinds(decide([node("n", consecutive_clean=2, **ours)], cluster(), S, NOW), "resume")
    [r] = kinds(decide([node("n", consecutive_clean=3, **ours)], cluster(), S, NOW), "resume")
    assert r.rule == "fault_cleared"


def test_guard_three_of_four_fail_with_half_limit_drains_two_and_trips():
    nodes = [node(f"node{i}", [DBE]) for i in (1, 2, 3)] + [node("node4")]
    res = decide(nodes, cluster(4), S, NOW)
    assert [d.node for d in kinds(res, "drain")] == ["node1", "node2"]
    [g] = kinds(res, "guard_tripped")
    assert g.rule == "guard_fraction" and g.details["blocked"] == ["node3"]
    assert res.guard_tripped


def test_tripped_guard_blocks_drains_but_allows_resumes():
    nodes = [
        node("node1", [DBE]),
        node("node2", drained=True, reason="babysitter: x", ours=True, consecutive_clean=5),
    ]
    res = decide(nodes, cluster(4, guard_tripped=True), S, NOW)
    assert not kinds(res, "drain")
    assert [d.node for d in kinds(res, "resume")] == ["node2"]


def test_rate_limit():
    res = decide([node("node1", [DBE])], cluster(100, drains_last_hour=20), S, NOW)
    assert not kinds(res, "drain") and kinds(res, "guard_tripped")[0].rule == "guard_rate"


def test_dry_run_decisions_are_flagged():
    dry = PolicySettings(dry_run=True, max_drained_fraction=0.5)
    [d] = kinds(decide([node("node1", [DBE])], cluster(), dry, NOW), "drain")
    assert d.dry_run


def test_pending_drain_is_not_decided_twice():
    assert not kinds(decide([node("node1", [DBE], drain_pending=True)], cluster(), S, NOW), "drain")


def test_heartbeat_missing_is_unknown_and_alerts():
    res = decide([node("node1", heartbeat_age_s=600)], cluster(), S, NOW)
    assert res.verdicts["node1"] == "unknown"
    assert kinds(res, "alert")[0].condition == "node_unknown"


def test_repeated_fatal_xid_escalates_and_lemon_node():
    hist = tuple(("gpu3", 79, NOW - timedelta(hours=i)) for i in range(5))
    drains = tuple(NOW - timedelta(days=i) for i in range(3))
    res = decide([node("node1", xid_history=hist, recent_drains=drains)], cluster(), S, NOW)
    rules = {d.rule for d in kinds(res, "escalate")}
    assert rules == {"xid_escalation", "lemon_node"}
    old = tuple(("gpu3", 79, NOW - timedelta(hours=30 + i)) for i in range(5))
    assert not kinds(decide([node("node1", xid_history=old)], cluster(), S, NOW), "escalate")


def test_xid_escalation_counts_events_not_the_reports_that_repeat_them():
    """One XID 79 escalated as "seen 5 times": the agent repeats a sticky XID in every report
    until the reboot (the same observed_at each time) and NVML and the kernel log both report
    most XIDs, seconds apart. Those are one event; five events an hour apart, each seen both
    ways, are five."""
    once = NOW - timedelta(hours=1)
    repeated = tuple(("gpu3", 79, once) for _ in range(12))
    both_ways = (*repeated, ("gpu3", 79, once + timedelta(seconds=2)))
    assert not kinds(decide([node("node1", xid_history=both_ways)], cluster(), S, NOW), "escalate")
    five = tuple(
        ("gpu3", 79, NOW - timedelta(hours=h, seconds=s)) for h in range(5) for s in (0, 3)
    )
    [esc] = kinds(decide([node("node1", xid_history=five)], cluster(), S, NOW), "escalate")
    assert esc.rule == "xid_escalation" and "seen 5 times" in esc.reason
    four = five[:8]  # four events, each seen twice
    assert not kinds(decide([node("node1", xid_history=four)], cluster(), S, NOW), "escalate")


def test_xid_escalation_and_lemon_limits_are_read_from_policy_config(tmp_path):
    conf = tmp_path / "babysitter.toml"
    conf.write_text(
        "[policy]\nxid_escalation_count = 2\nxid_escalation_window_h = 48\n"
        "lemon_drains = 5\nlemon_window_days = 30\n"
    )
    site = PolicySettings.from_config(load_config(conf))
    hist = tuple(("gpu3", 79, NOW - timedelta(hours=40 + i)) for i in range(2))
    drains = tuple(NOW - timedelta(days=5 * i) for i in range(4))
    facts = [node("node1", xid_history=hist, recent_drains=drains)]
    # the shipped defaults (5 in 24 h, 3 drains in 7 days): both fire on neither count
    assert not kinds(decide(facts, cluster(), S, NOW), "escalate")
    [xid] = kinds(decide(facts, cluster(), site, NOW), "escalate")
    assert xid.rule == "xid_escalation" and "2 times in 48 h" in xid.reason
    five = (*drains, NOW - timedelta(days=29))
    res = decide([node("node1", recent_drains=five)], cluster(), site, NOW)
    [lemon] = kinds(res, "escalate")
    assert lemon.rule == "lemon_node" and "5 times in 30 days" in lemon.reason


def test_rack_failure_in_a_10k_node_cluster_respects_the_guard():
    nodes = [node(f"n{i:05d}", [DBE] if 5000 <= i < 5032 else []) for i in range(10_000)]
    s = PolicySettings(max_drained_fraction=0.1, max_drains_per_hour=50)
    res = decide(nodes, cluster(10_000), s, NOW)
    assert len(kinds(res, "drain")) == 32
    s2 = PolicySettings(max_drained_fraction=0.002, max_drains_per_hour=50)
    res2 = decide(nodes, cluster(10_000), s2, NOW)
    assert len(kinds(res2, "drain")) == 20 and kinds(res2, "guard_tripped")


DEFAULT = PolicySettings()  # the shipped defaults: fraction 0.1, min_drainable 1


def test_default_policy_drains_the_first_fault_of_a_small_partition():
    res = decide([node("node2", [DBE]), node("node1")], cluster(4), DEFAULT, NOW)
    assert [d.node for d in kinds(res, "drain")] == ["node2"] and not res.guard_tripped


def test_default_policy_second_concurrent_fault_in_4_nodes_trips_the_guard():
    """Documented behaviour: a 4-node partition may hold max(1, 10 % x 4) = 1 node drained;
    a second concurrent fault is held back and the breaker trips (an admin resets it)."""
    res = decide([node("node2", [DBE]), node("node3", [DBE])], cluster(4), DEFAULT, NOW)
    assert [d.node for d in kinds(res, "drain")] == ["node2"]
    [g] = kinds(res, "guard_tripped")
    assert g.rule == "guard_fraction" and g.details["blocked"] == ["node3"]
    # one already drained by babysitter, a new fault: held back
    res = decide([node("node3", [DBE])], cluster(4, drained_by_us={"gpu": 1}), DEFAULT, NOW)
    assert not kinds(res, "drain") and res.guard_tripped


def test_min_drainable_raises_the_floor():
    s = PolicySettings(min_drainable=2)
    res = decide([node("node2", [DBE]), node("node3", [DBE])], cluster(4), s, NOW)
    assert len(kinds(res, "drain")) == 2 and not res.guard_tripped


def test_unknown_partition_sizes_decide_no_drain_and_alert_without_tripping():
    res = decide([node("node2", [DBE])], ClusterFacts(), DEFAULT, NOW)
    assert not kinds(res, "drain") and not kinds(res, "guard_tripped")
    assert not res.guard_tripped
    [a] = [d for d in kinds(res, "alert") if d.rule == "guard_unknown"]
    assert a.condition == "guard_sizes_unknown" and "node2" in a.reason
    # sizes known again: drained, and the alert resolves
    res = decide([node("node2", [DBE])], cluster(4), DEFAULT, NOW)
    assert kinds(res, "drain")
    assert any(d.condition == "guard_sizes_unknown" for d in kinds(res, "resolve_alert"))


NCCL_JOBLOG = {
    "check": "nccl.logs",
    "component": "job:4242",
    "severity": "critical",
    "code": "nccl.watchdog_timeout",
    "message": "job 4242 on node2: [Rank 0] Watchdog caught collective operation timeout",
    "action": "requeue_job",
    "details": {"node": "node2", "job_id": "4242"},
}


def test_job_log_finding_alone_never_drains_and_alerts_naming_the_job():
    res = decide([node("node2", [NCCL_JOBLOG])], cluster(4), DEFAULT, NOW)
    assert not kinds(res, "drain") and res.verdicts["node2"] == "healthy"
    [a] = [d for d in kinds(res, "alert") if d.rule == "job_owned_finding"]
    assert a.condition == "job_log_4242" and "job 4242" in a.reason and a.nodes == ("node2",)
    # with a node-level finding beside it, the node drains for the node finding
    res = decide([node("node2", [NCCL_JOBLOG, DBE])], cluster(4), DEFAULT, NOW)
    [d] = kinds(res, "drain")
    assert d.reason.startswith("gpu.memory")
