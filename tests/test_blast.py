"""Blast radius in layers as pure policy (controller/loop/decide/blast.py, and the gate inside
policy.decide): a tripped cap holds drains in its own scope only; resumes and other scopes go
on."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from babysitter.controller.loop.decide.blast import (
    BlastGate,
    BlastSettings,
    Cap,
    Scope,
    ScopeCounts,
)
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.node.policy import decide
from babysitter.finding import Action, Finding, Severity
from babysitter.slurm.topology import tree

NOW = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)
XID = Finding(
    check="xid.kmsg",
    component="gpu0",
    severity=Severity.CRITICAL,
    code="xid.79",
    message="XID 79",
    action=Action.REBOOT,
)
TOPO = tree(
    {"leaf1": [f"node{i}" for i in range(1, 5)], "leaf2": [f"node{i}" for i in range(5, 9)]}
)
PART = {f"node{i}": ("a" if i <= 4 else "b",) for i in range(1, 9)}


def counts(drained: dict[tuple[Scope, str], int] | None = None) -> ScopeCounts:
    sizes = {(Scope.PARTITION, "a"): 4, (Scope.PARTITION, "b"): 4, (Scope.CLUSTER, "cluster"): 8}
    sizes |= {(Scope.SWITCH, "leaf1"): 4, (Scope.SWITCH, "leaf2"): 4}
    return ScopeCounts(sizes, drained or {})


def test_limit_is_the_smaller_of_fraction_and_count_never_below_one():
    assert Cap(0.5, 3).limit(10) == 3
    assert Cap(0.5, 30).limit(10) == 5
    assert Cap(0.1, None).limit(4) == 1  # a scope's first fault is always drainable
    assert Cap(None, None).limit(7) == 7 and not Cap().active


def test_partition_cap_holds_its_own_scope_only():
    gate = BlastGate(BlastSettings(partition=Cap(count=1)), counts({(Scope.PARTITION, "a"): 1}))
    assert not gate.admit("node2", "leaf1", ("a",))
    assert gate.admit("node5", "leaf2", ("b",))  # the other partition drains
    assert not gate.admit("node6", "leaf2", ("b",))  # ... up to its own cap
    [a, b] = gate.tripped()
    assert (a.scope, a.name, a.blocked, a.limit) == (Scope.PARTITION, "a", ["node2"], 1)
    assert (b.name, b.blocked) == ("b", ["node6"])
    assert "partition a: 1 of 4 node(s)" in a.reason


def test_switch_and_cluster_caps():
    gate = BlastGate(
        BlastSettings(switch=Cap(fraction=0.5), cluster=Cap(count=3)),
        counts({(Scope.SWITCH, "leaf1"): 2, (Scope.CLUSTER, "cluster"): 2}),
    )
    assert not gate.admit("node3", "leaf1", ("a",))  # leaf1 holds 2 of 4: cap 2
    assert gate.admit("node5", "leaf2", ("b",))  # the third cluster-wide
    assert not gate.admit("node6", "leaf2", ("b",))  # the cluster cap now
    assert [(t.scope, t.name) for t in gate.tripped()] == [
        (Scope.SWITCH, "leaf1"),
        (Scope.CLUSTER, "cluster"),
    ]


def node(name: str, *findings: Finding, drained: bool = False, clean: int = 0) -> NodeFacts:
    return NodeFacts(
        name,
        open_findings=findings,
        consecutive_clean=clean,
        heartbeat_age_s=1.0,
        partitions=PART[name],
        drained=drained,
        ours=drained,
        reason="babysitter: xid: XID 79" if drained else "",
    )


def test_tripped_partition_cap_still_lets_recovered_nodes_resume_everywhere():
    """Partition a is at its cap (node1 drained, node2 newly broken): node2 is held; node3
    (recovered, same partition) and node5 (recovered, other partition) still resume, and
    node6 (new fault, other partition) still drains."""
    s = PolicySettings(
        max_drained_fraction=1.0, max_drains_per_hour=100, resume_after_clean_checks=2
    )
    facts = [
        node("node1", XID, drained=True),
        node("node2", XID),
        node("node3", drained=True, clean=2),
        node("node5", drained=True, clean=2),
        node("node6", XID),
    ]
    cluster = ClusterFacts({"a": 4, "b": 4}, {"a": 2, "b": 1})
    gate = BlastGate(
        BlastSettings(partition=Cap(count=2)),
        counts({(Scope.PARTITION, "a"): 2, (Scope.PARTITION, "b"): 1}),
    )
    r = decide(
        facts, cluster, s, NOW, lambda n: gate.admit(n.name, TOPO.leaf(n.name), n.partitions)
    )
    moves = sorted((d.kind, d.node) for d in r.decisions if d.kind in ("drain", "resume"))
    assert moves == [("drain", "node6"), ("resume", "node3"), ("resume", "node5")]
    assert not r.guard_tripped  # the cluster-wide breaker was never asked for node2
    assert [(t.name, t.blocked) for t in gate.tripped()] == [("a", ["node2"])]


@settings(max_examples=200, deadline=None)
@given(
    wanted=st.lists(st.sampled_from(sorted(PART)), unique=True),
    already=st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 4)),
    cap=st.integers(1, 4),
    fraction=st.one_of(st.none(), st.floats(0.05, 1.0)),
)
def test_a_scope_never_exceeds_its_cap_and_never_blocks_another(wanted, already, cap, fraction):
    c = Cap(fraction, cap)
    drained = {(Scope.PARTITION, p): n for p, n in already.items()}
    gate = BlastGate(BlastSettings(partition=c), counts(drained))
    admitted = [n for n in wanted if gate.admit(n, TOPO.leaf(n), PART[n])]
    for p in ("a", "b"):
        mine = [n for n in admitted if PART[n] == (p,)]
        before = already.get(p, 0)
        # never over the cap because of us; and all of a scope's wanted drains go through
        # while it has room, whatever the other scope does
        assert before + len(mine) <= max(before, c.limit(4))
        room = max(0, c.limit(4) - before)
        assert len(mine) == min(room, len([n for n in wanted if PART[n] == (p,)]))
