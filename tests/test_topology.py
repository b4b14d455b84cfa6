"""Slurm's topology as babysitter reads it (`scontrol show topology`, slurm/topology.py), and
the topology.conf devcluster writes for it. The real 22.05 output is read in
tests/test_fabric_e2e.py; these are the forms other versions and plugins print."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from babysitter.cli.devcluster_cmd import devcluster_group
from babysitter.devcluster.config import ClusterSpec, leaves, topology_conf
from babysitter.slurm.topology import parse_topology

TREE = """\
SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=node[1-4]
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=node[5-8]
SwitchName=spine Level=1 LinkSpeed=1 Nodes=node[1-8] Switches=leaf[1-2]
"""


def test_tree_nodes_get_their_leaf_then_the_spine():
    t = parse_topology(TREE)
    assert t.kind == "tree" and t.known and not t.skipped
    assert t.chain("node3") == ("leaf1", "spine") and t.leaf("node7") == "leaf2"
    assert t.size("leaf1") == 4 and t.size("spine") == 8
    assert t.chain("node9") == () and t.leaf("node9") is None
    assert t.summary() == {"kind": "tree", "switches": 3, "leaves": 2, "nodes": 8}


def test_three_levels():
    t = parse_topology(
        TREE
        + "SwitchName=leaf3 Level=0 Nodes=gpu[01-02]\n"
        + "SwitchName=spine2 Level=1 Switches=leaf3\n"
        + "SwitchName=core Level=2 Switches=spine,spine2\n"
    )
    assert t.chain("gpu02") == ("leaf3", "spine2", "core")
    assert t.chain("node1") == ("leaf1", "spine", "core") and t.size("core") == 10


def test_block_topology_blocks_are_leaves():
    t = parse_topology(
        "BlockName=b1 BlockIndex=0 Nodes=node[1-4] BlockSize=4\n"
        "BlockName=b2 BlockIndex=1 Nodes=node[5-8] BlockSize=4\n"
    )
    assert t.kind == "block" and t.chain("node6") == ("b2",)


def test_several_topologies_the_first_printed_is_used():
    t = parse_topology(
        "Topology=default SwitchName=s1 Level=0 Nodes=n[1-2]\n"
        "Topology=blocks BlockName=b1 BlockIndex=0 Nodes=n[1-2] BlockSize=2\n"
    )
    assert list(t.switches) == ["s1"] and t.kind == "tree"


def test_no_topology_and_unreadable_lines():
    assert not parse_topology("No topology information available\n").known
    t = parse_topology(
        "SwitchName=ok Level=0 Nodes=n1\n"
        "SwitchName=bad Level=x Nodes=n2\n"  # not a level
        "SwitchName=$(rm) Level=0 Nodes=n3\n"  # not a switch name
        "SwitchName=oddnodes Level=0 Nodes=n[5-\n"  # broken hostlist
        "garbage\n"
    )
    assert list(t.switches) == ["ok"] and t.skipped == 3


def test_devcluster_splits_nodes_evenly_over_leaves(tmp_path: Path):
    names = [f"node{i}" for i in range(1, 9)]
    assert leaves(names, 2) == {"leaf1": names[:4], "leaf2": names[4:]}
    assert [len(v) for v in leaves(names[:7], 3).values()] == [3, 2, 2]
    spec = ClusterSpec("c", tmp_path, "h", node_names=names, topology_leafs=2)
    text = topology_conf(spec)
    assert "SwitchName=leaf2 Nodes=node5,node6,node7,node8" in text
    assert text.strip().endswith("SwitchName=spine Switches=leaf1,leaf2")


def test_devcluster_topology_option_says_what_it_wants():
    r = CliRunner().invoke(devcluster_group, ["up", "--topology", "leaves=2"])
    assert r.exit_code == 2 and "expected leafs=N" in r.output
