"""`babysitter validate` fails closed: on a node whose NVML shows GPUs, backend `auto` with no
GPU backend must not pass the node on the CPU; an explicit `numpy` runs and says so. Real
pynvml over the fake libnvidia-ml (tests/fixtures/gpu.py); no torch/cupy GPU here."""

from __future__ import annotations

import json
import os
from pathlib import Path

from babysitter.devcluster.fakenvml import FakeGpus
from tests.fixtures.gpu import babysitter_env, run_babysitter


def _validate(env: dict[str, str], *args: str):
    return run_babysitter(env, "validate", "--stress-s", "0", *args)


def test_auto_without_gpu_backend_fails_with_one_line(
    gpus: FakeGpus, fakenvml_lib: Path, tmp_path: Path
):
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        agent__spool_path=str(tmp_path / "s.db"),
        checks__sdc__size="64",
    )
    r = _validate(env)
    assert r.returncode == 1
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("FAIL: SDC test could not run")
    assert "NVML shows 8 GPU(s)" in lines[0] and "backend" in lines[0]
    verdict = json.loads(_validate(env, "--json").stdout)
    assert verdict["ok"] is False and verdict["backend"] == "auto" and verdict["devices"] == []


def test_explicit_numpy_runs_and_says_so(gpus: FakeGpus, fakenvml_lib: Path, tmp_path: Path):
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        agent__spool_path=str(tmp_path / "s.db"),
        checks__sdc__size="64",
        checks__sdc__backend="numpy",
    )
    r = _validate(env, "--json")
    assert r.returncode == 0, r.stderr
    verdict = json.loads(r.stdout)
    assert verdict["ok"] is True and verdict["backend"] == "numpy"
    assert verdict["library"].startswith("numpy-") and len(verdict["devices"]) == 3
    assert "GPU(s) were not tested" in verdict["note"]


def test_auto_without_nvml_gpus_still_runs_on_the_cpu(tmp_path: Path):
    """A node with no GPU at all (no NVML library): the CPU run is all there is to test."""
    env = dict(os.environ)
    env.pop("BABYSITTER_CONFIG", None)
    env.pop("LD_LIBRARY_PATH", None)
    env["BABYSITTER_AGENT__SPOOL_PATH"] = str(tmp_path / "s.db")
    env["BABYSITTER_CHECKS__SDC__SIZE"] = "64"
    r = _validate(env, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["library"].startswith("numpy-")
