"""A job whose name or path is not UTF-8 (Slurm passes the bytes through, as a Linux path may
hold any) must not break babysitter's listing of every other job: found on the devcluster,
where the SPANK test's job with a Latin-1 checkpoint path made every later job listing raise
UnicodeDecodeError until Slurm forgot the job."""

from __future__ import annotations

import json
from pathlib import Path

from babysitter.slurm.cli import CliSlurmClient

DATA = Path(__file__).parent / "data" / "slurm" / "22.05"


def _fake_slurm(bin_dir: Path, squeue_out: bytes) -> None:
    bin_dir.mkdir()
    (bin_dir / "squeue.out").write_bytes(squeue_out)
    for prog, body in {
        "scontrol": 'echo "slurm 22.05.8"',
        "squeue": f'cat "{bin_dir / "squeue.out"}"',
    }.items():
        (bin_dir / prog).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / prog).chmod(0o755)


def test_a_job_with_latin1_bytes_leaves_the_other_jobs_listed(tmp_path: Path):
    doc = json.loads((DATA / "squeue.json").read_text())
    doc["jobs"][0]["name"] = "@NAME@"
    doc["jobs"][0]["comment"] = "babysit=ckpt=@PATH@"
    raw = json.dumps(doc).encode()
    raw = raw.replace(b"@NAME@", b"run-\xff\xfe").replace(b"@PATH@", b"/ck/run-\xe9")
    _fake_slurm(tmp_path / "bin", raw)

    jobs = CliSlurmClient(bin_dir=tmp_path / "bin").jobs()

    assert [j.job_id for j in jobs] == [j["job_id"] for j in doc["jobs"]]
    assert jobs[0].name == "run-\ufffd\ufffd"  # shown as undecodable, never raised
    assert jobs[1].name == doc["jobs"][1]["name"]
