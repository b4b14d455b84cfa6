"""The babysit SPANK plugin and job_submit.lua on the real devcluster, and agreement between
the C plugin's validation and babysitter.job.parse_babysit_args."""

from __future__ import annotations

import pytest

from babysitter.job import BabysitArgsError, babysit_spec, parse_babysit_args
from tests.fixtures.slurm import slurm

CASES = [
    "ckpt=/lustre/run1",
    "ckpt=/x,max_requeues=3,hang_timeout=1800",
    "max_requeues=0",
    "max_requeues=x",
    "ckpt=relative/dir",
    "hang_timeout=0",
    "colour=blue",
    "ckpt=/a,ckpt=/b",
    "ckpt",
    "max_requeues=-1",
    "max_requeues=999999999",
]


def python_accepts(value: str) -> bool:
    try:
        parse_babysit_args(value)
        return True
    except BabysitArgsError:
        return False


@pytest.mark.parametrize("value", CASES)
def test_plugin_and_python_agree(clean_cluster, value):
    r = slurm(
        clean_cluster,
        "sbatch",
        "--hold",
        "--parsable",
        "-o",
        "/dev/null",
        f"--babysit={value}",
        "--wrap",
        "true",
        check=False,
    )
    accepted = r.returncode == 0
    assert accepted == python_accepts(value), r.stderr
    if not accepted:
        assert "--babysit:" in r.stderr  # the plugin's own clear message


def test_opt_in_becomes_admin_comment_and_comment_fallback(clean_cluster):
    j1 = slurm(
        clean_cluster,
        "sbatch",
        "--hold",
        "--parsable",
        "-o",
        "/dev/null",
        "--babysit=ckpt=/c1,max_requeues=2",
        "--wrap",
        "true",
    ).stdout.strip()
    j2 = slurm(
        clean_cluster,
        "sbatch",
        "--hold",
        "--parsable",
        "-o",
        "/dev/null",
        "--comment=babysit=ckpt=/c2",
        "--wrap",
        "true",
    ).stdout.strip()
    j3 = slurm(
        clean_cluster, "sbatch", "--hold", "--parsable", "-o", "/dev/null", "--wrap", "true"
    ).stdout.strip()

    def admin_comment(j: str) -> str:
        out = slurm(clean_cluster, "scontrol", "show", "job", j).stdout
        lines = [ln for ln in out.splitlines() if "AdminComment=" in ln]
        return lines[0].split("AdminComment=", 1)[1].strip() if lines else ""

    assert admin_comment(j1) == "babysit=ckpt=/c1,max_requeues=2"
    assert admin_comment(j2) == "babysit=ckpt=/c2"
    assert admin_comment(j3) == ""
    assert babysit_spec(admin_comment(j1)) == {"ckpt": "/c1", "max_requeues": 2}
    assert babysit_spec("", "babysit=ckpt=/c2") == {"ckpt": "/c2"}
    assert babysit_spec("", "please babysit=nonsense") is None
