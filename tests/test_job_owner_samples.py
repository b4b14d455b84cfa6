"""A job alert's owner is the job's Slurm user, read from the job listing the controller
already reads: every backend's parser gives it, on real Slurm output (the world corpus of
slurmrestd answers, and this project's captures of `scontrol show job --json`, `squeue
--json` and `scontrol show job -o`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from babysitter.slurm import parse

DATA = Path(__file__).parent / "data"
WORLD = DATA / "world" / "slurm"
JOB_DOCS = sorted(
    [
        WORLD / s["file"]
        for s in map(json.loads, (WORLD / "samples.jsonl").read_text().splitlines())
        if s["expect"]["kind"] == "jobs"
    ]
    + [p for p in (DATA / "slurm").glob("*/*.json") if p.stem in ("jobs", "squeue")]
)


@pytest.mark.parametrize("path", JOB_DOCS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_listed_job_carries_its_user(path: Path) -> None:
    doc = json.loads(path.read_text())
    jobs = parse.jobs_from_json(doc)
    assert jobs
    # the document's own words: user_name of each job, in order
    assert [j.user for j in jobs] == [raw["user_name"] for raw in doc["jobs"]]
    assert all(j.user for j in jobs)


def test_the_text_listing_carries_the_user_too() -> None:
    lines = (DATA / "slurm" / "22.05" / "scontrol_show_job.txt").read_text().splitlines()
    jobs = [parse.job_from_scontrol(line) for line in lines if line.strip()]
    assert jobs and {j.user for j in jobs} == {"root"}  # `UserId=root(0)`
