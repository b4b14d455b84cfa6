"""Run one SDC test: seeded inputs, a matmul per device, ABFT + cross-device (or golden)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash

from babysitter.checks.sdc import abft, fingerprint
from babysitter.checks.sdc.backends import Device, devices
from babysitter.finding import Action, Finding, Severity

log = logging.getLogger(__name__)

NP_DTYPES = {"float64": np.float64, "float32": np.float32, "float16": np.float16}


@dataclass
class DeviceResult:
    device: str
    label: str
    model: str
    digest: str
    abft_ok: bool
    abft_worst_ratio: float
    matches_peers: bool | None
    matmul_s: float
    verify_s: float
    gflops: float
    digest_algo: str  # part of the golden key (DIGEST_ALGO or fingerprint.ALGO)
    golden_error: str = ""  # the stored golden digests could not be read: not compared


@dataclass
class SdcResult:
    backend: str
    library: str
    dtype: str
    size: int
    seed: int
    devices: list[DeviceResult]
    findings: list[Finding] = field(default_factory=list)
    golden: str | None = None
    reference_source: str = "computed"  # "memory", "disk" or "computed"
    reference_s: float = 0.0


def inputs(n: int, dtype: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (n, n)).astype(NP_DTYPES[dtype])
    b = rng.uniform(-1, 1, (n, n)).astype(NP_DTYPES[dtype])
    return a, b


def _golden_path(state_dir: Path | None) -> Path:
    d = state_dir or Path(os.environ.get("BABYSITTER_STATE_DIR", "/var/lib/babysitter"))
    return d / "sdc-golden.json"


# Part of the golden key, so digests stored under another algorithm are ignored (and replaced)
# instead of being reported as a mismatch after an upgrade. Host (numpy) devices hash C with
# xxh3; torch/cupy devices return fingerprint.ALGO computed on the device.
DIGEST_ALGO = "xxh3_128"


def digest(c: np.ndarray) -> str:
    """Hash of C's bytes for the bit-identical comparison. Not a security boundary, it only has
    to change when C does: xxh3 is ~15x faster than sha256 over a 16 MB C."""
    return xxhash.xxh3_128_hexdigest(np.ascontiguousarray(c).data.cast("B"))


# --- ABFT reference cache -------------------------------------------------------------------
# The reference depends only on the inputs, i.e. on (seed, size, dtype) and numpy's RNG stream,
# so it is computed once and kept in memory (for a process that reruns the test) and on disk
# beside the golden digests (what the agent's test, a fresh child process each time, reads).

_REF_FIELDS = ("col_ref", "col_tol", "row_ref", "row_tol")
_REF_MEM_MAX = 4
_ref_mem: OrderedDict[str, abft.Reference] = OrderedDict()
_ref_lock = threading.Lock()


def _ref_key(size: int, dtype: str, seed: int) -> str:
    # numpy does not promise the same Generator stream across versions
    return f"v{abft.REFERENCE_VERSION}|numpy-{np.__version__}|{dtype}|{size}|{seed}"


def _ref_path(state_dir: Path | None, size: int, dtype: str, seed: int) -> Path:
    # one file per (dtype, size, seed): a numpy upgrade overwrites it instead of adding files
    return _golden_path(state_dir).parent / f"sdc-ref-{dtype}-{size}-{seed}.npz"


def _ref_hash(key: str, arrays: list[np.ndarray]) -> str:
    h = xxhash.xxh3_128(key.encode())
    for x in arrays:
        h.update(np.ascontiguousarray(x).data.cast("B"))
    return h.hexdigest()


def _load_ref(path: Path, key: str, size: int) -> abft.Reference | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = [z[f] for f in _REF_FIELDS]
            stored_key, stored_hash = str(z["key"]), str(z["hash"])
    except Exception:  # missing, truncated, not an npz, members missing: recompute
        return None
    if stored_key != key or any(x.dtype != np.float64 or x.shape != (size,) for x in arrays):
        return None
    # a flipped bit in the file would otherwise fail every device's ABFT check
    if stored_hash != _ref_hash(key, arrays):
        return None
    return abft.Reference(*arrays)


def _save_ref(path: Path, key: str, ref: abft.Reference) -> None:
    arrays = [getattr(ref, f) for f in _REF_FIELDS]
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(
                f,
                key=np.array(key),
                hash=np.array(_ref_hash(key, arrays)),
                **dict(zip(_REF_FIELDS, arrays, strict=True)),
            )
        tmp.replace(path)
    except OSError:  # read-only or full state dir: the in-memory cache still works
        tmp.unlink(missing_ok=True)


def _remember(key: str, ref: abft.Reference) -> None:
    with _ref_lock:
        _ref_mem[key] = ref
        _ref_mem.move_to_end(key)
        while len(_ref_mem) > _REF_MEM_MAX:
            _ref_mem.popitem(last=False)


def clear_reference_cache() -> None:
    """Forget the in-memory references (the files stay)."""
    with _ref_lock:
        _ref_mem.clear()


def cached_reference(
    size: int,
    dtype: str,
    seed: int,
    state_dir: Path | None = None,
    ab: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[abft.Reference, str]:
    """abft.prepare() of inputs(size, dtype, seed), from memory, disk or computed (ab: those
    inputs, if the caller has them already). Returns the reference and where it came from."""
    key = _ref_key(size, dtype, seed)
    with _ref_lock:
        ref = _ref_mem.get(key)
        if ref is not None:
            _ref_mem.move_to_end(key)
            return ref, "memory"
    path = _ref_path(state_dir, size, dtype, seed)
    ref = _load_ref(path, key, size)
    if ref is not None:
        _remember(key, ref)
        return ref, "disk"
    a, b = ab if ab is not None else inputs(size, dtype, seed)
    ref = abft.prepare(a, b, dtype)
    _store_reference(size, dtype, seed, state_dir, ref)
    return ref, "computed"


def _store_reference(
    size: int, dtype: str, seed: int, state_dir: Path | None, ref: abft.Reference
) -> None:
    key = _ref_key(size, dtype, seed)
    _remember(key, ref)
    _save_ref(_ref_path(state_dir, size, dtype, seed), key, ref)


def run_sdc(
    backend: str = "auto",
    size: int = 2048,
    dtype: str = "float32",
    seed: int = 1234,
    replicas: int = 1,
    inject: tuple[int, int, int, int] | None = None,
    state_dir: Path | None = None,
    check_name: str = "sdc",
) -> SdcResult:
    """inject = (device index, row, col, bit): flip that bit of C on that device before
    verification (fault-injection for tests and the benchmark)."""
    if dtype not in NP_DTYPES:
        raise ValueError(f"dtype {dtype} is not supported by the host-side verifier")
    library, devs = devices(backend, replicas)
    a, b = inputs(size, dtype, seed)
    t = time.perf_counter()
    ref, ref_source = cached_reference(size, dtype, seed, state_dir, (a, b))
    ref_s = time.perf_counter() - t
    results: list[DeviceResult] = []
    sums: list[tuple[np.ndarray, np.ndarray]] = []
    for idx, d in enumerate(devs):
        flip = inject[1:] if inject and inject[0] == idx else None
        result, dev_sums = _run_device(d, a, b, ref, size, flip)
        results.append(result)
        sums.append(dev_sums)
    if ref_source != "computed" and not all(r.abft_ok for r in results):
        _recheck_with_fresh_reference(a, b, ref, results, sums, size, dtype, seed, state_dir)
    out = SdcResult(
        backend, library, dtype, size, seed, results, reference_source=ref_source, reference_s=ref_s
    )
    # identical inputs must give bit-identical outputs: across devices, or against the digest
    # a single device stored on its first clean run
    if len(results) > 1:
        majority: str | None = _vote(results)
    else:
        majority = None
        out.golden = _compare_golden(results[0], library, dtype, size, seed, state_dir, inject)
    for r in results:
        out.findings.append(_finding(check_name, r, majority, library, dtype, size, seed))
    return out


def _run_device(
    d: Device,
    a: np.ndarray,
    b: np.ndarray,
    ref: abft.Reference,
    size: int,
    flip: tuple[int, int, int] | None,
) -> tuple[DeviceResult, tuple[np.ndarray, np.ndarray]]:
    """The matmul on one device, its checksums against the reference, and its digest."""
    dev_out = d.run(a, b, flip)
    t = time.perf_counter()
    if dev_out.c is not None:  # host device: C is here already
        col, row = abft.checksums(dev_out.c)
        dig, algo = digest(dev_out.c), DIGEST_ALGO
    else:  # verified on the device: only the sums and the fingerprint came back
        assert dev_out.col_sums is not None and dev_out.row_sums is not None
        assert dev_out.fingerprint is not None
        col, row = dev_out.col_sums, dev_out.row_sums
        dig, algo = dev_out.fingerprint, fingerprint.ALGO
    res = abft.check_sums(ref, col, row)
    ver_s = dev_out.device_verify_s + time.perf_counter() - t
    mm_s = dev_out.matmul_s
    result = DeviceResult(
        d.name,
        d.label,
        d.model,
        dig,
        res.ok,
        res.worst_ratio,
        None,
        mm_s,
        ver_s,
        2 * size**3 / max(mm_s, 1e-9) / 1e9,
        algo,
    )
    return result, (col, row)


def _recheck_with_fresh_reference(
    a: np.ndarray,
    b: np.ndarray,
    ref: abft.Reference,
    results: list[DeviceResult],
    sums: list[tuple[np.ndarray, np.ndarray]],
    size: int,
    dtype: str,
    seed: int,
    state_dir: Path | None,
) -> None:
    """A wrong cached reference must not drain a healthy node: confirm against a fresh one."""
    fresh = abft.prepare(a, b, dtype)
    if all(np.array_equal(getattr(fresh, f), getattr(ref, f)) for f in _REF_FIELDS):
        return
    _store_reference(size, dtype, seed, state_dir, fresh)
    for r, (col, row) in zip(results, sums, strict=True):
        res = abft.check_sums(fresh, col, row)
        r.abft_ok, r.abft_worst_ratio = res.ok, res.worst_ratio


def _vote(results: list[DeviceResult]) -> str:
    """The digest most devices whose checksums passed agree on (a device ABFT already caught
    gets no vote); "" when no strict majority can be trusted (e.g. two devices that disagree:
    nobody can be named the good one, so every device is reported). Sets matches_peers."""
    digests = [r.digest for r in results]
    voters = [r.digest for r in results if r.abft_ok] or digests
    majority = max(sorted(set(voters)), key=voters.count)
    if voters.count(majority) * 2 <= len(voters):
        majority = ""
    for r in results:
        r.matches_peers = r.digest == majority
    return majority


def _compare_golden(
    r0: DeviceResult,
    library: str,
    dtype: str,
    size: int,
    seed: int,
    state_dir: Path | None,
    inject: tuple[int, int, int, int] | None,
) -> str | None:
    """One device: compare with the stored golden digest (sets matches_peers), or store this
    result as the golden one when it is verified and uninjected. Returns the stored digest."""
    key = "|".join([r0.digest_algo, library, dtype, str(size), str(seed), r0.model])
    path = _golden_path(state_dir)
    try:
        golden = json.loads(path.read_text())
    except FileNotFoundError:
        golden = {}
    except (OSError, ValueError) as exc:
        golden = exc
    if not isinstance(golden, dict):
        # never re-baselined from here: that would overwrite the digests it holds with this
        # run's (possibly corrupt) result, and hide whatever damaged the file
        why = golden if isinstance(golden, Exception) else "not a JSON object"
        r0.golden_error = f"cannot read {path}: {why}"[:300]
        log.warning("SDC golden digests unreadable, not compared: %s", r0.golden_error)
        return None
    if key in golden:
        r0.matches_peers = golden[key] == r0.digest
        return str(golden[key])
    if r0.abft_ok and inject is None:
        golden[key] = r0.digest
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(golden, indent=1))
            tmp.replace(path)
        except OSError:
            pass
    return None


def _finding(
    check_name: str,
    r: DeviceResult,
    majority: str | None,
    library: str,
    dtype: str,
    size: int,
    seed: int,
) -> Finding:
    """One device's verdict (majority: the peers' digest, "" for none, None: single device)."""
    if not r.abft_ok:
        severity, code, action = Severity.CRITICAL, "sdc.abft_mismatch", Action.DRAIN
        message = (
            f"{r.label} ({r.model}): matmul checksums off by "
            f"{r.abft_worst_ratio:.3g}x the rounding bound: silent data corruption"
        )
    elif r.golden_error:
        severity, code, action = Severity.WARNING, "sdc.golden_unreadable", Action.INSPECT
        message = (
            f"{r.label}: checksums verified, but not compared with the stored golden digest "
            f"({r.golden_error}); fix or remove the file to re-baseline"
        )
    elif r.matches_peers is False:
        if majority is None:
            other = "the stored golden digest"
        else:
            other = "the other devices" if majority else "its peers, with no majority to trust"
        severity, code, action = Severity.CRITICAL, "sdc.mismatch", Action.DRAIN
        message = f"{r.label} ({r.model}): result differs bit-wise from {other}"
    else:
        severity, code, action = Severity.OK, "sdc.ok", Action.NONE
        message = f"{r.label}: {size}x{size} {dtype} matmul verified, {r.gflops:.0f} GFLOP/s"
    return Finding(
        check=check_name,
        component=r.device,
        severity=severity,
        code=code,
        message=message,
        action=action,
        details={
            "device": r.label,
            "model": r.model,
            "gflops": round(r.gflops, 1),
            "verify_s": round(r.verify_s, 4),
            "matmul_s": round(r.matmul_s, 4),
            "abft_worst_ratio": r.abft_worst_ratio,
            "library": library,
            "dtype": dtype,
            "size": size,
            "seed": seed,
        },
    )
