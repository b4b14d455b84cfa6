"""`make gpu-check` (bench/gpu_check.py, issue 41 deliverable 7) on a machine without a GPU:
it stops by itself, non-zero, with one line that says why, and it never takes babysitter's
fake NVML for a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check

REPO = Path(__file__).resolve().parents[1]


def reason_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("gpu-check:")]


def test_make_gpu_check_without_a_gpu_stops_with_one_line():
    assert not list(Path("/dev").glob("nvidia[0-9]*")), "this test is for a machine without a GPU"
    r = subprocess.run(
        ["make", "--no-print-directory", "gpu-check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,  # it ends on its own; a hang fails here
    )
    assert r.returncode != 0
    assert reason_lines(r.stderr) == ["gpu-check: no NVIDIA GPU here: no /dev/nvidia[0-9]* device"]


@pytest.mark.parametrize("how", ["ld_library_path", "state"])
def test_the_fake_nvml_is_refused_by_the_script(gpus, fakenvml_lib, how):
    env = {k: v for k, v in os.environ.items() if k not in ("FAKE_NVML_STATE", "LD_LIBRARY_PATH")}
    fake = gpus.env(fakenvml_lib)
    if how == "ld_library_path":
        env["LD_LIBRARY_PATH"] = fake["LD_LIBRARY_PATH"]
        why = "gpu-check: LD_LIBRARY_PATH points at babysitter's fake NVML"
    else:
        env["FAKE_NVML_STATE"] = fake["FAKE_NVML_STATE"]
        why = "gpu-check: FAKE_NVML_STATE is set"
    r = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == gpu_check.EXIT_NO_GPU
    [line] = reason_lines(r.stderr)
    assert line.startswith(why)


def test_a_fake_nvml_loaded_any_other_way_is_refused(fakenvml_lib, tmp_path, monkeypatch):
    """Device files and nvidia-smi present (stand-ins), the fake preloaded rather than on
    LD_LIBRARY_PATH: the library NVML actually loaded is looked at, and refused."""
    (tmp_path / "nvidia0").touch()
    monkeypatch.setattr(gpu_check, "DEVICE_GLOB", str(tmp_path / "nvidia[0-9]*"))
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H100 80GB HBM3, GPU-x, 550.54.15, 81559 MiB, '\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("FAKE_NVML_STATE", "LD_LIBRARY_PATH")}
    env["PATH"] = f"{smi.parent}:{env['PATH']}"
    env["LD_PRELOAD"] = str(fakenvml_lib / "libnvidia-ml.so.1")
    with pytest.raises(gpu_check.NoGpu, match="the NVML library loaded is babysitter's fake"):
        gpu_check.preflight(env)


def test_no_nvidia_smi_is_refused(tmp_path, monkeypatch):
    (tmp_path / "nvidia0").touch()
    monkeypatch.setattr(gpu_check, "DEVICE_GLOB", str(tmp_path / "nvidia[0-9]*"))
    env = {"PATH": str(tmp_path)}
    with pytest.raises(gpu_check.NoGpu, match="nvidia-smi is not installed"):
        gpu_check.preflight(env)
