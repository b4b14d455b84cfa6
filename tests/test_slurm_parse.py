"""Parsing Slurm's output without daemons: real 22.05 samples (captured from a devcluster, see
tests/data/slurm/README.md), the documented 24.11+ shapes, and garbage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from babysitter.slurm import parse
from babysitter.slurm.hostlist import expand

DATA = Path(__file__).parent / "data" / "slurm"


def load(version: str, name: str) -> dict:
    return json.loads((DATA / version / name).read_text())


def test_2205_sinfo_nodes_states_and_reasons():
    nodes = {n.name: n for n in parse.nodes_from_json(load("22.05", "sinfo.json"))}
    assert nodes["node1"].state == "MIXED"
    assert nodes["node2"].drained_or_draining
    assert nodes["node2"].reason == "babysitter: gpu.ecc: DBE on gpu3"
    assert nodes["node3"].down and nodes["node3"].not_responding
    assert nodes["node1"].partitions == ("gpu",)


def test_2205_squeue_jobs():
    jobs = {j.job_id: j for j in parse.jobs_from_json(load("22.05", "squeue.json"))}
    j1 = jobs[1]
    assert j1.restart_count == 1
    assert j1.excluded_nodes == ("node2",)
    assert j1.comment == "babysit=ckpt=/tmp/ck"
    assert j1.nodes == ("node1",)
    assert jobs[2].running and jobs[2].restart_count == 0


def test_2205_scontrol_oneliners_agree_with_json():
    by_json = {n.name: n for n in parse.nodes_from_json(load("22.05", "sinfo.json"))}
    lines = (DATA / "22.05" / "scontrol_show_node.txt").read_text().splitlines()
    for line in lines:
        n = parse.node_from_scontrol(line)
        assert n.name in by_json
        assert n.reason == by_json[n.name].reason
        assert n.drained_or_draining == by_json[n.name].drained_or_draining
    jobs_json = {j.job_id: j for j in parse.jobs_from_json(load("22.05", "squeue.json"))}
    for line in (DATA / "22.05" / "scontrol_show_job.txt").read_text().splitlines():
        j = parse.job_from_scontrol(line)
        assert j.restart_count == jobs_json[j.job_id].restart_count
        assert j.excluded_nodes == jobs_json[j.job_id].excluded_nodes
        assert j.comment == jobs_json[j.job_id].comment


def test_newer_shapes_state_lists_number_objects_and_completing_trap():
    """24.11+ shapes as documented in shared/notes/slurm-versions.md (constructed here; the
    version-matrix tests read real samples from those versions' daemons)."""
    node = parse.node_from_json(
        {
            "name": "node2",
            "state": ["IDLE", "DRAIN"],
            "reason": "babysitter: x",
            "partitions": ["gpu"],
            "gres": "gpu:8",
        }
    )
    assert node.state == "IDLE" and node.drained_or_draining
    job = parse.job_from_json(
        {
            "job_id": 7,
            "job_state": ["PENDING", "COMPLETING"],
            "restart_cnt": {"set": True, "infinite": False, "number": 1},
            "nodes": "node[1-2]",
            "excluded_nodes": "node2",
            "admin_comment": "babysit=ckpt=/c",
            "job_resources": {"nodes": {"allocation": [{"name": "node1"}]}},
        }
    )
    assert job.restart_count == 1
    assert not job.pending  # still completing on its old node
    assert job.nodes == ("node1", "node2")
    assert parse.number({"set": False, "infinite": True}) == 0


@pytest.mark.parametrize(
    "expr,expected",
    [
        ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
        ("gpu-a[01-02],login", ["gpu-a01", "gpu-a02", "login"]),
        ("", []),
        ("(null)", []),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ],
)
def test_hostlist(expr, expected):
    assert expand(expr) == expected


@given(st.text(max_size=60))
def test_hostlist_garbage_is_a_value_error_or_a_list(s):
    try:
        out = expand(s)
    except ValueError:
        return
    assert isinstance(out, list)


@given(st.text(max_size=300))
def test_scontrol_garbage_never_crashes(s):
    parse.node_from_scontrol(s)
    parse.job_from_scontrol(s)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_json_garbage_is_a_value_error_or_parsed(doc):
    for fn in (parse.nodes_from_json, parse.jobs_from_json):
        try:
            fn(doc if isinstance(doc, dict) else {"nodes": doc, "jobs": doc})
        except ValueError:
            pass


@pytest.mark.parametrize(
    "doc",
    [
        {"nodes": [{"partitions": 5, "state": 7, "name": [1]}]},
        {"jobs": [{"job_state": 5, "excluded_nodes": 5, "nodes": 5}]},
        {"jobs": [{"job_resources": {"allocated_nodes": [1, None]}}]},
        {"jobs": [{"excluded_nodes": "node["}]},
        {"nodes": "not a list"},
    ],
)
def test_wrong_types_are_a_clear_value_error_not_a_crash(doc):
    fn = parse.nodes_from_json if "nodes" in doc else parse.jobs_from_json
    try:
        fn(doc)
    except ValueError as exc:
        assert str(exc)


@pytest.mark.parametrize(
    "path", ["22.05/sinfo.json", "24.11/nodes.json", "25.11/nodes.json", "26.05/nodes.json"]
)
def test_rest_node_listing_reads_the_same_nodes_as_a_full_decode(path):
    """The rest backend decodes /nodes into only the keys it reads (10,000 nodes are 12.6 MB):
    every version's listing gives the same nodes as decoding all of it."""
    from babysitter.slurm.rest import _decode_nodes

    raw = (DATA / path).read_bytes()
    assert parse.nodes_from_json(_decode_nodes(raw)) == parse.nodes_from_json(json.loads(raw))


@pytest.mark.parametrize(
    "raw", [b'{"nodes": [1, 2]}', b'{"nodes": "x"}', b"[]", b'{"errors": [{"error": "e"}]}']
)
def test_rest_node_listing_of_another_shape_is_decoded_in_full(raw):
    from babysitter.slurm.rest import _decode_nodes

    assert _decode_nodes(raw) == json.loads(raw)
