"""The pyslurm backend as an admin uses it: `babysitter slurm ...` with slurm.backend = "pyslurm"
against the 25.11 devcluster (real pyslurm, real libslurm). The contract itself runs for pyslurm
in tests/test_slurm_contract.py; the stand-in module these tests once used is gone.

Kept here too, because the venv under test has pyslurm installed: the one-line error when
pyslurm cannot be imported (a subprocess where the import fails for real) and when there is no
slurm.conf (libslurm would exit the process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from babysitter.devcluster import ClusterInfo
from tests.fixtures.slurm import slurm


def bs(info: ClusterInfo, conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = info.env()
    env.pop("BABYSITTER_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "--config", str(conf), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def pyslurm_config(tmp_path: Path, info: ClusterInfo) -> Path:
    conf = tmp_path / "b.toml"
    conf.write_text(f"[slurm]\nbackend = 'pyslurm'\nslurm_conf = '{info.slurm_conf}'\n")
    return conf


def test_drain_via_pyslurm_shows_in_sinfo_and_admin_drain_is_refused(
    pyslurm_module, clean_2511, tmp_path
):
    info = clean_2511
    conf = pyslurm_config(tmp_path, info)
    r = bs(info, conf, "slurm", "drain", "node2", "--reason", "x")
    assert r.returncode == 0, r.stderr
    out = slurm(info, "sinfo", "-h", "-N", "-n", "node2", "-o", "%t|%E").stdout
    assert out.strip().replace("*", "") in ("drain|babysitter: x", "drng|babysitter: x")
    assert "25.11" in slurm(info, "sinfo", "--version").stdout

    slurm(info, "scontrol", "update", "nodename=node3", "state=drain", "reason=admin maintenance")
    r = bs(info, conf, "slurm", "resume", "node3")
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "not babysitter's" in r.stderr
    assert "Traceback" not in r.stderr
    out = slurm(info, "sinfo", "-h", "-N", "-n", "node3", "-o", "%t|%E").stdout
    assert out.strip().replace("*", "") == "drain|admin maintenance"

    r = bs(info, conf, "slurm", "resume", "node2")
    assert r.returncode == 0, r.stderr


def test_without_pyslurm_the_backend_says_why_on_one_line(clean_2511, tmp_path):
    conf = pyslurm_config(tmp_path, clean_2511)
    # importing pyslurm fails for real in this interpreter (None in sys.modules)
    code = (
        "import sys; sys.modules['pyslurm'] = None; "
        "from babysitter.cli.main import main; "
        f"sys.argv = ['babysitter', '--config', {str(conf)!r}, 'slurm', 'nodes']; main()"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "BABYSITTER_CONFIG"},
    )
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert "pyslurm is not importable" in r.stderr and "'cli' or 'rest'" in r.stderr


def test_missing_slurm_conf_is_an_error_not_an_exit(tmp_path):
    conf = tmp_path / "b.toml"
    conf.write_text(f"[slurm]\nbackend = 'pyslurm'\nslurm_conf = '{tmp_path / 'nope.conf'}'\n")
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "--config", str(conf), "slurm", "nodes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and "no slurm.conf" in r.stderr
    assert "Traceback" not in r.stderr
