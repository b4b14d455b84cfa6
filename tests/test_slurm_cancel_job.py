"""`cancel_job` (babysitter's own validation job, issue 42): every backend runs `scancel JOB`
(OwnedClient through Scontrol), a job that ended already is no error, one Slurm forgot is
SlurmNotFound, and a job id that is not one never reaches Slurm. A fake `scancel` records its
arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from babysitter.slurm.cli import CliSlurmClient
from babysitter.slurm.client import SlurmNotFound, SlurmRejected


def _client(tmp_path: Path, stderr: str = "", code: int = 0) -> CliSlurmClient:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv"
    body = f'echo "$@" >> "{log}"\n'
    if stderr:
        body += f"echo '{stderr}' >&2\n"
    (bin_dir / "scancel").write_text(f"#!/bin/sh\n{body}exit {code}\n")
    (bin_dir / "scancel").chmod(0o755)
    return CliSlurmClient(bin_dir=bin_dir)


def _argv(tmp_path: Path) -> list[str]:
    log = tmp_path / "argv"
    return log.read_text().splitlines() if log.exists() else []


def test_cancel_job_runs_scancel_on_that_job_only(tmp_path: Path):
    _client(tmp_path).cancel_job(4242)
    assert _argv(tmp_path) == ["4242"]


def test_a_job_that_ended_already_is_cancelled(tmp_path: Path):
    err = "scancel: error: Kill job error on job id 7: Job/step already completing or completed"
    _client(tmp_path, err, 1).cancel_job(7)  # nothing left to cancel: no error


def test_a_job_slurm_forgot_is_not_found(tmp_path: Path):
    err = "scancel: error: Kill job error on job id 7: Invalid job id specified"
    with pytest.raises(SlurmNotFound):
        _client(tmp_path, err, 1).cancel_job(7)


@pytest.mark.parametrize("bad", [0, -1, "7;rm", "all"])
def test_a_bad_job_id_never_reaches_scancel(tmp_path: Path, bad: object):
    with pytest.raises(SlurmRejected):
        _client(tmp_path).cancel_job(bad)  # type: ignore[arg-type]
    assert _argv(tmp_path) == []
