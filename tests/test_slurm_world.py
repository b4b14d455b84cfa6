"""babysitter/slurm/parse.py against Slurm's JSON as real daemons printed it, one document per
data_parser version from v0.0.37 (21.08) to v0.0.45 (26.05): slurmrestd answers and `--json`
output other projects committed, and this project's own captures of 22.05 and 26.05
(tests/data/world/slurm/). Each document's nodes or jobs must come out with the name, state,
flags and reason (nodes) or the id, state list, node list, requeue flag, restart count, batch
host and reason (jobs) Slurm gave them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from babysitter.slurm import parse

FOLDER = Path(__file__).parent / "data" / "world" / "slurm"
SAMPLES = [json.loads(line) for line in (FOLDER / "samples.jsonl").read_text().splitlines()]


def _doc(sample: dict) -> dict:
    return json.loads((FOLDER / sample["file"]).read_text())


@pytest.mark.parametrize(
    "sample", [s for s in SAMPLES if s["expect"]["kind"] == "nodes"], ids=lambda s: s["id"]
)
def test_nodes_come_out_as_slurm_printed_them(sample):
    got = [
        {"name": n.name, "state": n.state, "flags": sorted(n.flags), "reason": n.reason}
        for n in parse.nodes_from_json(_doc(sample))
    ]
    assert got == sample["expect"]["nodes"]


@pytest.mark.parametrize(
    "sample", [s for s in SAMPLES if s["expect"]["kind"] == "jobs"], ids=lambda s: s["id"]
)
def test_jobs_come_out_as_slurm_printed_them(sample):
    got = [
        {
            "job_id": j.job_id,
            "states": list(j.states),
            "nodes": list(j.nodes),
            "requeue": j.requeue,
            "restart_count": j.restart_count,
            "batch_host": j.batch_host,
            "state_reason": j.state_reason,
        }
        for j in parse.jobs_from_json(_doc(sample))
    ]
    assert got == sample["expect"]["jobs"]


def test_a_drained_node_reads_drained_in_every_version():
    """The flag babysitter acts on: DRAIN as 22.05's state_flags or later versions' state list."""
    drained = {}
    for s in SAMPLES:
        if s["expect"]["kind"] == "nodes":
            for n in parse.nodes_from_json(_doc(s)):
                if n.reason == "ECC memory error":
                    drained[s["data_parser"]] = "DRAIN" in n.flags
    assert drained and all(drained.values()), drained
    assert {"v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44"} <= set(drained)


def test_the_corpus_spans_the_versions():
    assert len(SAMPLES) >= 20
    assert {s["data_parser"] for s in SAMPLES} >= {f"v0.0.{n}" for n in range(38, 46)}
