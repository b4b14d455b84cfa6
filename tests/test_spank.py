"""The babysit SPANK plugin and job_submit.lua on the real devcluster, and agreement between
the C plugin's validation and babysitter.job.parse_babysit_args through a real sbatch (the
generated specs are tests/test_babysit_spec_parity.py's)."""

from __future__ import annotations

import json
import os

import pytest

from babysitter.checkpoints import find_latest_complete, write_resume_json
from babysitter.job import BabysitArgsError, babysit_spec, parse_babysit_args
from tests.fixtures.slurm import slurm, wait_for

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
    "max_requeues=²",
    "hang_timeout=١٢",
    "max_requeues=000000001",
    # whitespace anywhere is refused by both (AdminComment is split on it)
    "ckpt=/x ",
    "max_requeues=3\u3000",
    "ckpt=/a b",
    "ckpt=/" + "p" * 1100,  # past the plugin's old 1,024-byte buffer, a usable path
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


@pytest.mark.parametrize(
    "name",
    # no whitespace: a --babysit value has none (tests/test_babysit_spec_parity.py)
    ["run-é-日本-🚀-x", os.fsdecode(b"run-\xff\xfe-latin1-\xe9"), 'q"uo\\te'],
    ids=["utf8", "not-utf8", "json-escapes"],
)
def test_plugin_reads_any_resume_path_python_writes(clean_cluster, tmp_path, name):
    """What babysitter.checkpoints writes into resume.json, the plugin hands to the job
    byte for byte as BABYSIT_RESUME_FROM."""
    ckpt = tmp_path / name
    (ckpt / "step3").mkdir(parents=True)
    (ckpt / "step3" / "w.bin").write_bytes(b"w")
    (ckpt / "step3" / ".complete").write_bytes(b"")
    choice = find_latest_complete(ckpt)
    assert choice is not None
    write_resume_json(ckpt, choice, job_id=1, restart_count=1)
    out = tmp_path / "env.out"
    r = slurm(
        clean_cluster,
        "sbatch",
        "--parsable",
        "-o",
        "/dev/null",
        f"--babysit=ckpt={ckpt}",
        "--wrap",
        f'printf %s "$BABYSIT_RESUME_FROM" > {out}.tmp && mv {out}.tmp {out}',
    )
    assert r.stdout.strip()
    wait_for(out.exists, 30, "the job to write its environment")
    assert out.read_bytes() == os.fsencode(ckpt / "step3")


def test_plugin_ignores_a_linked_state_dir_and_a_fifo(clean_cluster, tmp_path):
    """`.babysitter` as a link, or resume.json as a FIFO: no BABYSIT_RESUME_FROM, no hang."""
    outs = []
    for case in ("link", "fifo"):
        ckpt = tmp_path / case
        (ckpt / "step3").mkdir(parents=True)
        other = tmp_path / f"other-{case}"
        other.mkdir()
        (other / "resume.json").write_text(json.dumps({"path": str(ckpt / "step3")}))
        if case == "link":
            (ckpt / ".babysitter").symlink_to(other)
        else:
            (ckpt / ".babysitter").mkdir()
            os.mkfifo(ckpt / ".babysitter" / "resume.json")
        out = tmp_path / f"{case}.out"
        slurm(
            clean_cluster,
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            f"--babysit=ckpt={ckpt}",
            "--wrap",
            f'printf "[%s]" "$BABYSIT_RESUME_FROM" > {out}.tmp && mv {out}.tmp {out}',
        )
        outs.append(out)
    for out in outs:
        wait_for(out.exists, 30, f"{out.name} written")
        assert out.read_text() == "[]"


@pytest.mark.parametrize(
    "text",
    [
        "babysit=max_requeues=²",
        "babysit=hang_timeout=١٢",
        "babysit=max_requeues=" + "9" * 5000,
        "babysit=ckpt=/x,hang_timeout=" + "1" * 100_000,
        "babysit=" + "," * 100_000,
    ],
    ids=["superscript", "arabic-indic", "5000-digits", "huge-timeout", "commas"],
)
def test_hostile_specs_are_refused_not_raised(text):
    """Comment/AdminComment are user-controlled: a spec that is not ASCII digits or is huge
    makes the job not babysat (None), it never raises out of the controller's tick."""
    assert babysit_spec(text, "") in (None, {})  # AdminComment
    assert babysit_spec("", text) in (None, {})  # the --comment fallback
