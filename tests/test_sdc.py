"""SDC matmul test on CPU backends (numpy, torch CPU). Several CPU "devices" stand in for GPUs
in the cross-device tests (there are no GPUs here); the CUDA paths are the same code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from babysitter.checks.sdc import abft, run_sdc


def bs(tmp_path, *args):
    env = dict(os.environ, BABYSITTER_AGENT__SPOOL_PATH=str(tmp_path / "spool.db"))
    env.pop("BABYSITTER_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "sdc-test", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_clean_run_passes_on_cpu(tmp_path):
    r = bs(tmp_path, "--backend", "numpy", "--size", "256", "--json")
    assert r.returncode == 0, r.stderr
    [f] = json.loads(r.stdout)
    assert f["code"] == "sdc.ok" and f["component"] == "cpu"
    assert f["details"]["gflops"] > 0 and f["details"]["verify_s"] >= 0


def test_exponent_bit_flip_fails_and_names_the_device(tmp_path):
    """Three CPU devices stand in for GPUs; device 2 gets a flipped exponent bit."""
    r = bs(
        tmp_path,
        "--backend",
        "numpy",
        "--size",
        "256",
        "--devices",
        "3",
        "--inject",
        "2,10,20,28",
        "--json",
    )
    assert r.returncode == 2
    bad = [f for f in json.loads(r.stdout) if f["severity"] != "ok"]
    assert [f["details"]["device"] for f in bad] == ["cpu:2"]
    assert bad[0]["code"] == "sdc.abft_mismatch"


def test_low_mantissa_flip_is_caught_by_cross_device_comparison(tmp_path):
    res = run_sdc("numpy", 256, "float32", 7, replicas=3, inject=(1, 3, 4, 1), state_dir=tmp_path)
    bad = [f for f in res.findings if f.severity != "ok"]
    assert [(f.code, f.details["device"]) for f in bad] == [("sdc.mismatch", "cpu:1")]


def test_single_device_uses_a_golden_digest(tmp_path):
    first = run_sdc("numpy", 128, "float32", 3, state_dir=tmp_path)
    assert all(f.severity == "ok" for f in first.findings)
    again = run_sdc("numpy", 128, "float32", 3, state_dir=tmp_path, inject=(0, 1, 1, 1))
    assert [f.code for f in again.findings] == ["sdc.mismatch"]
    assert again.golden == first.devices[0].digest


def test_torch_cpu_backend():
    pytest.importorskip("torch", reason="torch CPU is installed by make setup")
    res = run_sdc("torch", 128, "float32", 5, replicas=2, inject=(0, 0, 0, 30))
    assert [f.severity for f in res.findings] == ["critical", "ok"]


def test_tolerance_is_derived_from_dtype_and_size():
    assert abft.gamma(1024, abft.UNIT_ROUNDOFF["float32"]) == pytest.approx(1024 * 2**-24, rel=1e-3)
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (64, 64)).astype(np.float32)
    b = rng.uniform(-1, 1, (64, 64)).astype(np.float32)
    c = a @ b
    assert abft.verify(a, b, c, "float32").ok
    c[3, 4] += 1.0
    r = abft.verify(a, b, c, "float32")
    assert not r.ok and 3 in r.bad_rows and 4 in r.bad_cols


def test_bad_injection_arguments_are_a_clear_error(tmp_path):
    r = bs(tmp_path, "--backend", "numpy", "--size", "64", "--inject", "0,1,1,99")
    assert r.returncode == 2 and r.stderr.startswith("error:")
