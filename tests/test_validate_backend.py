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


def test_explicit_numpy_on_a_gpu_node_fails_and_says_why(
    gpus: FakeGpus, fakenvml_lib: Path, tmp_path: Path
):
    """A CPU run passes only a node configured with no GPUs: on one with 8, numpy tested none
    of them (issue 42)."""
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        agent__spool_path=str(tmp_path / "s.db"),
        checks__sdc__size="64",
        checks__sdc__backend="numpy",
    )
    r = _validate(env, "--json")
    assert r.returncode == 1, r.stderr
    verdict = json.loads(r.stdout)
    assert verdict["ok"] is False and verdict["backend"] == "numpy"
    assert verdict["library"].startswith("numpy-") and len(verdict["devices"]) == 3
    assert verdict["gpus_tested"] == [] and verdict["gpus_expected"] == 8
    assert any("tested 0 of the node's 8 GPU(s)" in f for f in verdict["failures"])
    # the node configured with none (the controller's job: --gpus from its Slurm gres): a pass
    r = _validate(env, "--json", "--gpus", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["gpus_expected"] == 0


def test_nvml_driver_not_loaded_fails_validation_never_runs_on_the_cpu(
    gpus: FakeGpus, fakenvml_lib: Path, tmp_path: Path
):
    """After a reboot the driver is not loaded: NVML fails to start. That is not "0 GPUs, run
    numpy": the validation fails and names the NVML error, with and without --gpus."""
    gpus.set(init_error=9).write()  # NVML_ERROR_DRIVER_NOT_LOADED
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        agent__spool_path=str(tmp_path / "s.db"),
        checks__sdc__size="64",
    )
    for args, expected in (((), None), (("--gpus", "8"), 8)):
        r = _validate(env, "--json", *args)
        assert r.returncode == 1, r.stdout + r.stderr
        verdict = json.loads(r.stdout)
        assert verdict["ok"] is False and verdict["gpus_expected"] == expected
        assert verdict["devices"] == [] and verdict["library"] is None
        assert any("NVML" in f and "Driver Not Loaded" in f for f in verdict["failures"]), verdict


def test_nvml_driver_not_loaded_fails_even_with_gpus_0_and_numpy(
    gpus: FakeGpus, fakenvml_lib: Path, tmp_path: Path
):
    """`--gpus 0` (an old controller's "no GPU gres", or an admin's) with NVML's library
    installed but not starting: the node has GPUs nobody can see. It passed on the CPU with
    backend numpy; only a node with no NVML library at all may be validated on the CPU."""
    gpus.set(init_error=9).write()  # NVML_ERROR_DRIVER_NOT_LOADED
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        agent__spool_path=str(tmp_path / "s.db"),
        checks__sdc__size="64",
        checks__sdc__backend="numpy",
    )
    r = _validate(env, "--json", "--gpus", "0")
    assert r.returncode == 1, r.stdout + r.stderr
    verdict = json.loads(r.stdout)
    assert verdict["ok"] is False and verdict["library"] is None, verdict
    assert any("NVML" in f and "Driver Not Loaded" in f for f in verdict["failures"]), verdict


def test_nvml_error_during_the_watch_fails_with_the_error_named(
    gpus: FakeGpus, fakenvml_lib: Path, tmp_path: Path
):
    """The ECC watch reads NVML before and after the stress; an error there used to read as
    "no data" and the watch stopped silently."""
    gpus.error(2, "nvmlDeviceGetTotalEccErrors", 15).write()  # NVML_ERROR_UNKNOWN on GPU 2
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        agent__spool_path=str(tmp_path / "s.db"),
        checks__sdc__size="64",
        checks__sdc__backend="numpy",
    )
    r = _validate(env, "--json", "--gpus", "0")  # even where a CPU run would be enough
    assert r.returncode == 1, r.stdout + r.stderr
    failures = json.loads(r.stdout)["failures"]
    assert any(f.startswith("GPU 2: NVML error reading ECC errors") for f in failures), failures


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


def test_the_agents_sdc_backend_auto_never_reads_an_nvml_error_as_no_gpu(
    gpus: FakeGpus, fakenvml_lib: Path, tmp_path: Path
):
    """`auto` fell back to numpy when NVML failed to start ("0 GPUs"): the agent's SDC test
    then passed a GPU node on the CPU. An NVML error is "cannot tell", never "no GPU"."""
    import subprocess
    import sys

    gpus.set(init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    code = (
        "from babysitter.checks.sdc.backends import BackendUnavailable, devices\n"
        "try:\n    print(devices('auto')[0])\n"
        "except BackendUnavailable as exc:\n    print('unavailable:', exc)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.stdout.startswith("unavailable:") and "Driver Not Loaded" in r.stdout, r
