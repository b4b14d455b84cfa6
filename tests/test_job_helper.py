"""The job-side helper: stdlib only, and `babysitter resume-path` gives the same answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from babysitter import job
from babysitter.checkpoints import find_latest_complete, write_resume_json

REPO = Path(__file__).resolve().parents[1]


def test_helper_imports_without_daemon_dependencies():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, *a):\n"
        "        if name.split('.')[0] in ('pydantic', 'httpx', 'sqlalchemy', 'fastapi', "
        "'click', 'rich', 'numpy', 'pynvml'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from babysitter import job\n"
        "print(job.resume_path('/nonexistent'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "None"


def test_resume_path_sources_and_cli_agree(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    for step in (1, 2):
        d = ckpt / f"step{step}"
        d.mkdir(parents=True)
        (d / "w.bin").write_text("x")
        job.mark_checkpoint_complete(d)
    (ckpt / "step3").mkdir()
    (ckpt / "step3" / "w.bin").write_text("half")
    monkeypatch.delenv("BABYSIT_RESUME_FROM", raising=False)
    assert job.resume_path(ckpt) == str(ckpt / "step2")  # discovery
    choice = find_latest_complete(ckpt)
    assert choice is not None
    write_resume_json(ckpt, choice, job_id=1, restart_count=1)
    assert job.resume_path(ckpt) == str(ckpt / "step2")  # resume.json
    monkeypatch.setenv("BABYSIT_RESUME_FROM", str(ckpt / "step1"))
    assert job.resume_path(ckpt) == str(ckpt / "step1")  # the plugin's variable wins
    env = dict(os.environ, BABYSIT_CKPT=str(ckpt))
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "resume-path"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.stdout.strip() == str(ckpt / "step1")
    env.pop("BABYSIT_RESUME_FROM")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "babysitter.cli.main",
            "resume-path",
            "--ckpt",
            str(tmp_path / "fresh"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0 and r.stdout.strip() == ""


def test_heartbeat_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    job.heartbeat(12, tmp_path)
    assert '"step": 12' in (tmp_path / ".babysitter" / "heartbeat-77.json").read_text()
