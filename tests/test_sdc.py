"""SDC matmul test on CPU backends (numpy, torch CPU). Several CPU "devices" stand in for GPUs
in the cross-device tests (there are no GPUs here); the CUDA paths are the same code."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from babysitter.checks.sdc import abft, backends, fingerprint, run_sdc, runner
from babysitter.checks.sdc.backends import _cpu_model


@pytest.fixture(autouse=True)
def _fresh_reference_cache():
    runner.clear_reference_cache()
    yield
    runner.clear_reference_cache()


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
    # the second run reads the ABFT reference the first one stored in the state dir
    for _ in range(2):
        r = bs(tmp_path, "--backend", "numpy", "--size", "256", "--json")
        assert r.returncode == 0, r.stderr
        [f] = json.loads(r.stdout)
        assert f["code"] == "sdc.ok" and f["component"] == "cpu"
        assert f["details"]["gflops"] > 0 and f["details"]["verify_s"] >= 0
    assert list(tmp_path.glob("sdc-ref-float32-256-*.npz"))


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


def test_two_devices_that_disagree_are_both_reported(tmp_path):
    # with no majority there is no good device to trust: blaming one would be a coin toss
    res = run_sdc("numpy", 256, "float32", 7, replicas=2, inject=(1, 3, 4, 1), state_dir=tmp_path)
    bad = [f for f in res.findings if f.severity != "ok"]
    assert [(f.code, f.details["device"]) for f in bad] == [
        ("sdc.mismatch", "cpu:0"),
        ("sdc.mismatch", "cpu:1"),
    ]
    assert "no majority" in bad[0].message


def test_single_device_uses_a_golden_digest(tmp_path):
    first = run_sdc("numpy", 128, "float32", 3, state_dir=tmp_path)
    assert all(f.severity == "ok" for f in first.findings)
    again = run_sdc("numpy", 128, "float32", 3, state_dir=tmp_path, inject=(0, 1, 1, 1))
    assert [f.code for f in again.findings] == ["sdc.mismatch"]
    assert again.golden == first.devices[0].digest


def test_torch_cpu_backend():
    _torch()
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


def _same(r1: abft.Reference, r2: abft.Reference) -> bool:
    fields = ("col_ref", "col_tol", "row_ref", "row_tol")
    return all(np.array_equal(getattr(r1, f), getattr(r2, f)) for f in fields)


def test_cached_reference_equals_a_fresh_prepare(tmp_path):
    fresh = abft.prepare(*runner.inputs(128, "float32", 3), "float32")
    ref, src = runner.cached_reference(128, "float32", 3, tmp_path)
    assert src == "computed" and _same(ref, fresh)
    ref, src = runner.cached_reference(128, "float32", 3, tmp_path)
    assert src == "memory" and _same(ref, fresh)
    runner.clear_reference_cache()  # as after an agent restart
    ref, src = runner.cached_reference(128, "float32", 3, tmp_path)
    assert src == "disk" and _same(ref, fresh)


def test_prepare_matches_the_textbook_float64_reference():
    a, b = runner.inputs(200, "float32", 8)
    ref = abft.prepare(a, b, "float32")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(ref.col_ref, a64.sum(axis=0) @ b64, rtol=0, atol=1e-9)
    np.testing.assert_allclose(ref.row_ref, a64 @ b64.sum(axis=1), rtol=0, atol=1e-9)
    factor = ref.col_tol[0] / (np.abs(a64).sum(axis=0) @ np.abs(b64))[0]
    assert factor >= abft.gamma(200, abft.UNIT_ROUNDOFF["float32"])
    np.testing.assert_allclose(ref.row_tol, factor * (np.abs(a64) @ np.abs(b64).sum(axis=1)))


def _bitflip_file(path):
    data = bytearray(path.read_bytes())
    ref = abft.prepare(*runner.inputs(128, "float32", 3), "float32")
    at = data.find(ref.col_tol.tobytes()[:64])
    assert at > 0
    data[at + 5] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(b"not an npz"),
        lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
        _bitflip_file,
    ],
    ids=["garbage", "truncated", "bit-flip"],
)
def test_corrupt_reference_file_is_recomputed(tmp_path, damage):
    runner.cached_reference(128, "float32", 3, tmp_path)
    [path] = tmp_path.glob("sdc-ref-*.npz")
    damage(path)
    runner.clear_reference_cache()
    ref, src = runner.cached_reference(128, "float32", 3, tmp_path)
    assert src == "computed"
    assert _same(ref, abft.prepare(*runner.inputs(128, "float32", 3), "float32"))
    runner.clear_reference_cache()
    assert runner.cached_reference(128, "float32", 3, tmp_path)[1] == "disk"  # rewritten
    res = run_sdc("numpy", 128, "float32", 3, replicas=2, state_dir=tmp_path)
    assert all(f.code == "sdc.ok" for f in res.findings)


def test_a_reference_for_another_size_is_not_used(tmp_path):
    runner.cached_reference(128, "float32", 3, tmp_path)
    [small] = tmp_path.glob("sdc-ref-*.npz")
    small.rename(runner._ref_path(tmp_path, 256, "float32", 3))
    runner.clear_reference_cache()
    ref, src = runner.cached_reference(256, "float32", 3, tmp_path)
    assert src == "computed" and ref.col_ref.shape == (256,)
    res = run_sdc("numpy", 256, "float32", 3, state_dir=tmp_path)
    assert [f.code for f in res.findings] == ["sdc.ok"]


def test_a_wrong_cached_reference_does_not_drain_a_healthy_node(tmp_path):
    """A stale reference with a valid file checksum (e.g. written by a buggy older version) is
    confirmed against a fresh one before any device is blamed, and replaced."""
    wrong = abft.prepare(*runner.inputs(128, "float32", 4), "float32")
    key = runner._ref_key(128, "float32", 3)
    runner._save_ref(runner._ref_path(tmp_path, 128, "float32", 3), key, wrong)
    res = run_sdc("numpy", 128, "float32", 3, replicas=2, state_dir=tmp_path)
    assert res.reference_source == "disk"
    assert [f.code for f in res.findings] == ["sdc.ok", "sdc.ok"]
    runner.clear_reference_cache()
    ref, src = runner.cached_reference(128, "float32", 3, tmp_path)
    assert src == "disk" and not _same(ref, wrong)


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_exponent_flip_is_caught_with_a_cached_reference(tmp_path, source):
    first = run_sdc("numpy", 256, "float32", 9, replicas=3, state_dir=tmp_path)
    assert first.reference_source == "computed"
    if source == "disk":
        runner.clear_reference_cache()
    res = run_sdc(
        "numpy", 256, "float32", 9, replicas=3, inject=(2, 10, 20, 28), state_dir=tmp_path
    )
    assert res.reference_source == source
    bad = [f for f in res.findings if f.severity != "ok"]
    assert [(f.code, f.details["device"]) for f in bad] == [("sdc.abft_mismatch", "cpu:2")]


def test_golden_digest_from_the_sha256_version_is_ignored(tmp_path):
    """After an upgrade, a golden entry written by the sha256 code must not read as corruption."""
    a, b = runner.inputs(128, "float32", 3)
    old_key = "|".join([f"numpy-{np.__version__}", "float32", "128", "3", _cpu_model()])
    old = {old_key: hashlib.sha256((a @ b).tobytes()).hexdigest()}
    (tmp_path / "sdc-golden.json").write_text(json.dumps(old))
    first = run_sdc("numpy", 128, "float32", 3, state_dir=tmp_path)
    assert [f.code for f in first.findings] == ["sdc.ok"] and first.golden is None
    again = run_sdc("numpy", 128, "float32", 3, state_dir=tmp_path)
    assert [f.code for f in again.findings] == ["sdc.ok"]
    assert again.golden == first.devices[0].digest


# --- device-side verification (torch, cupy) ---------------------------------------------------
# CUDA is not available here (and never will be on this machine): the torch CPU device runs the
# very same code as a cuda:N device (checksums, fingerprint and bit flip on the device, only the
# small results copied back), so these tests exercise the GPU path up to the device string.


def _torch():
    # imported, never skipped: `make venv` installs torch's CPU build or fails
    import torch

    return torch


def _device_fp(torch, c: np.ndarray) -> str:
    w = tuple(torch.from_numpy(x.copy()) for x in fingerprint.weights(*c.shape))
    return fingerprint.to_hex(fingerprint.torch_sums(torch.from_numpy(c.copy()), w).numpy())


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("chunk", [None, 1000], ids=["one-chunk", "chunked"])
def test_fingerprint_is_the_same_on_the_host_and_in_torch(monkeypatch, dtype, chunk):
    torch = _torch()
    if chunk:
        monkeypatch.setattr(fingerprint, "_CHUNK_ELEMS", chunk)
    rng = np.random.default_rng(1)
    # large magnitudes of both signs, so every product and sum wraps around 2^64
    c = (rng.standard_normal((67, 45)) * 1e3).astype(dtype)
    host = fingerprint.host(c)
    assert len(host) == 32
    assert _device_fp(torch, c) == host
    assert fingerprint.host(c[::-1].copy()) != host


@pytest.mark.parametrize(
    ("dtype", "bits"),
    [
        ("float32", [0, 1, 11, 22, 23, 27, 30, 31]),  # mantissa, exponent, sign
        ("float16", [0, 9, 10, 14, 15]),
        ("float64", [0, 51, 52, 62, 63]),
    ],
)
def test_every_single_bit_flip_changes_the_fingerprint(dtype, bits):
    """Weights are odd, so a flip of bit k moves each sum by an odd multiple of 2^k: never 0."""
    torch = _torch()
    c = runner.inputs(48, dtype, 2)[0]
    assert all((w & 1).all() for w in fingerprint.weights(*c.shape))
    clean = fingerprint.host(c)
    for i, j in [(0, 0), (47, 47), (13, 29), (-1, 0)]:
        for bit in bits:
            flipped = c.copy()
            abft.flip_bit(flipped, i, j, bit)
            fp = fingerprint.host(flipped)
            assert fp != clean, (i, j, bit)
            # each of the two sums changes on its own
            assert fp[:16] != clean[:16] and fp[16:] != clean[16:], (i, j, bit)
            # the on-device flip used for fault injection flips the very same bit
            tc = torch.from_numpy(c.copy())
            backends.torch_flip_bit(tc, i, j, bit)
            assert tc.numpy().tobytes() == flipped.tobytes(), (i, j, bit)
            assert _device_fp(torch, flipped) == fp


def test_torch_device_returns_sums_and_fingerprint_not_c():
    torch = _torch()
    a, b = runner.inputs(96, "float32", 4)
    _, [dev] = backends.torch_devices(1)
    out = dev.run(a, b, None)
    assert out.c is None
    assert out.col_sums.shape == (96,) and out.row_sums.shape == (96,)
    c = (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()
    assert out.fingerprint == fingerprint.host(c)
    host_col, host_row = abft.checksums(c)
    np.testing.assert_allclose(out.col_sums, host_col, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out.row_sums, host_row, rtol=1e-5, atol=1e-4)
    assert abft.check_sums(abft.prepare(a, b, "float32"), out.col_sums, out.row_sums).ok


def test_torch_backend_three_devices_pass_clean(tmp_path):
    torch = _torch()
    res = run_sdc("torch", 256, "float32", 7, replicas=3, state_dir=tmp_path)
    assert [f.code for f in res.findings] == ["sdc.ok"] * 3
    a, b = runner.inputs(256, "float32", 7)
    expect = fingerprint.host((torch.from_numpy(a) @ torch.from_numpy(b)).numpy())
    assert [r.digest for r in res.devices] == [expect] * 3
    assert {r.digest_algo for r in res.devices} == {fingerprint.ALGO}
    assert all(r.matches_peers and r.abft_ok for r in res.devices)


def test_torch_exponent_flip_on_device_1_is_caught_and_named(tmp_path):
    _torch()
    res = run_sdc(
        "torch", 256, "float32", 7, replicas=3, inject=(1, 10, 20, 30), state_dir=tmp_path
    )
    bad = [f for f in res.findings if f.severity != "ok"]
    assert [(f.code, f.details["device"]) for f in bad] == [("sdc.abft_mismatch", "cpu:1")]
    assert res.devices[1].matches_peers is False


def test_torch_mantissa_lsb_flip_is_caught_by_cross_device_comparison(tmp_path):
    _torch()
    res = run_sdc("torch", 256, "float32", 7, replicas=3, inject=(1, 3, 4, 0), state_dir=tmp_path)
    assert all(r.abft_ok for r in res.devices)  # below the rounding bound
    bad = [f for f in res.findings if f.severity != "ok"]
    assert [(f.code, f.details["device"]) for f in bad] == [("sdc.mismatch", "cpu:1")]


def test_torch_injection_bit_out_of_range_is_an_error(tmp_path):
    _torch()
    with pytest.raises(ValueError, match="bit must be"):
        run_sdc("torch", 64, "float32", 1, inject=(0, 1, 1, 32), state_dir=tmp_path)


def test_golden_xxh3_entry_is_ignored_for_the_torch_backend(tmp_path):
    """A golden digest stored under another algorithm is never compared with the fingerprint."""
    torch = _torch()
    a, b = runner.inputs(128, "float32", 3)
    lib = f"torch-{torch.__version__}"
    old_key = "|".join([runner.DIGEST_ALGO, lib, "float32", "128", "3", _cpu_model()])
    c = (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()
    (tmp_path / "sdc-golden.json").write_text(json.dumps({old_key: runner.digest(c)}))
    first = run_sdc("torch", 128, "float32", 3, state_dir=tmp_path)
    assert [f.code for f in first.findings] == ["sdc.ok"] and first.golden is None
    stored = json.loads((tmp_path / "sdc-golden.json").read_text())
    new_key = "|".join([fingerprint.ALGO, lib, "float32", "128", "3", _cpu_model()])
    assert stored[new_key] == first.devices[0].digest == fingerprint.host(c)
    again = run_sdc("torch", 128, "float32", 3, state_dir=tmp_path)
    assert [f.code for f in again.findings] == ["sdc.ok"] and again.golden == stored[new_key]
    # and the fingerprint golden does catch a flip below the ABFT bound
    hit = run_sdc("torch", 128, "float32", 3, state_dir=tmp_path, inject=(0, 5, 5, 0))
    assert [f.code for f in hit.findings] == ["sdc.mismatch"]


def test_torch_wrong_cached_reference_is_rechecked_with_the_device_sums(tmp_path):
    _torch()
    wrong = abft.prepare(*runner.inputs(128, "float32", 4), "float32")
    runner._save_ref(
        runner._ref_path(tmp_path, 128, "float32", 3), runner._ref_key(128, "float32", 3), wrong
    )
    res = run_sdc("torch", 128, "float32", 3, replicas=2, state_dir=tmp_path)
    assert res.reference_source == "disk"
    assert [f.code for f in res.findings] == ["sdc.ok", "sdc.ok"]


@pytest.mark.parametrize(
    "fault",
    [
        ("error", 2, "nvmlDeviceGetComputeRunningProcesses_v3", 999),  # NVML_ERROR_UNKNOWN
        ("lose", 5),
    ],
)
def test_sdc_check_never_runs_when_nvml_cannot_say_the_gpus_are_idle(
    gpus, fakenvml_lib, tmp_path, fault
):
    """An NVML error in the busy-GPU guard counts as busy: the invasive test must not take GPUs
    that may hold a job."""
    from tests.fixtures.gpu import babysitter_env, run_babysitter

    getattr(gpus, fault[0])(*fault[1:])
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        checks__sdc__size="32",
        checks__sdc__backend="numpy",
        agent__spool_path=str(tmp_path / "spool.db"),
    )
    r = run_babysitter(env, "check", "--json", "--only", "sdc.matmul")
    findings = json.loads(r.stdout)
    assert [f["code"] for f in findings] == ["sdc.skipped_unknown"], findings
    assert not list(tmp_path.glob("sdc-*"))  # no matmul ran, no reference stored


@pytest.mark.parametrize("content", [b"{truncated", b"[1, 2]", b"\xff\xfe garbage"])
def test_an_unreadable_golden_file_is_reported_and_never_re_baselined(tmp_path, content):
    """The stored digests could not be read: the run says so (a warning to inspect) instead of
    storing this run's result as the new golden one over the file."""
    golden = tmp_path / "sdc-golden.json"
    golden.write_bytes(content)
    res = run_sdc("numpy", 64, "float32", 3, state_dir=tmp_path)
    [f] = res.findings
    assert (f.code, f.severity) == ("sdc.golden_unreadable", "warning"), f
    assert "sdc-golden.json" in f.message and res.golden is None
    assert golden.read_bytes() == content  # left for a human, not overwritten
    # a later run still does not adopt its own digest as the reference
    again = run_sdc("numpy", 64, "float32", 3, state_dir=tmp_path)
    assert [f.code for f in again.findings] == ["sdc.golden_unreadable"]
