"""SDC detection coverage by flipped bit (sign, exponent, mantissa) for ABFT alone and ABFT +
cross-device comparison, and the verification overhead as a fraction of matmul time.
Run: python -m bench.sdc  (writes bench/results/sdc.json and sdc.md)"""

from __future__ import annotations

import hashlib
import statistics
import time

import numpy as np

from babysitter.checks.sdc import abft
from babysitter.checks.sdc.runner import inputs
from bench.common import RESULTS_DIR, figure, write_result

COVERAGE_N = 256
PER_BIT = 100


def coverage() -> dict[str, dict[str, float]]:
    a, b = inputs(COVERAGE_N, "float32", 11)
    c_ref = a @ b
    ref_digest = hashlib.sha256(c_ref.tobytes()).hexdigest()
    ref = abft.prepare(a, b, "float32")
    col_tol, row_tol = ref.col_tol, ref.row_tol
    rng = np.random.default_rng(5)
    per_bit: dict[int, dict[str, int]] = {}
    for bit in range(32):
        s = per_bit.setdefault(bit, {"n": 0, "abft": 0, "cross": 0, "above": 0, "abft_above": 0})
        for _ in range(PER_BIT):
            i, j = int(rng.integers(COVERAGE_N)), int(rng.integers(COVERAGE_N))
            c = c_ref.copy()
            abft.flip_bit(c, i, j, bit)
            delta = abs(float(c[i, j]) - float(c_ref[i, j]))
            above = (not np.isfinite(delta)) or delta > min(col_tol[j], row_tol[i])
            detected = not abft.check(ref, c).ok
            cross = hashlib.sha256(c.tobytes()).hexdigest() != ref_digest
            s["n"] += 1
            s["abft"] += detected
            s["cross"] += detected or cross
            s["above"] += above
            s["abft_above"] += detected and above
    groups = {"sign": [31], "exponent": list(range(23, 31)), "mantissa": list(range(0, 23))}
    out: dict[str, dict[str, float]] = {}
    for name, bits in groups.items():
        n = sum(per_bit[b]["n"] for b in bits)
        above = sum(per_bit[b]["above"] for b in bits)
        out[name] = {
            "injections": n,
            "abft_detected": sum(per_bit[b]["abft"] for b in bits) / n,
            "abft_plus_cross_detected": sum(per_bit[b]["cross"] for b in bits) / n,
            "above_tolerance": above,
            "abft_detected_above_tolerance": (
                sum(per_bit[b]["abft_above"] for b in bits) / above if above else float("nan")
            ),
        }
    above_all = sum(s["above"] for s in per_bit.values())
    out["all"] = {
        "injections": sum(s["n"] for s in per_bit.values()),
        "abft_detected": sum(s["abft"] for s in per_bit.values()) / (32 * PER_BIT),
        "abft_plus_cross_detected": sum(s["cross"] for s in per_bit.values()) / (32 * PER_BIT),
        "above_tolerance": above_all,
        "abft_detected_above_tolerance": sum(s["abft_above"] for s in per_bit.values())
        / max(above_all, 1),
    }
    return out


def overhead(n: int, repeats: int = 3, devices: int = 8) -> dict[str, float]:
    """Per-device verification (ABFT checksums of C + bit-compare with a peer) against the
    matmul it checks, plus the once-per-test reference (from A and B) spread over `devices`."""
    a, b = inputs(n, "float32", 1)
    mm, ver, prep = [], [], []
    peer = a @ b
    for _ in range(repeats):
        t = time.perf_counter()
        c = a @ b
        mm.append(time.perf_counter() - t)
        t = time.perf_counter()
        ref = abft.prepare(a, b, "float32")
        prep.append(time.perf_counter() - t)
        t = time.perf_counter()
        abft.check(ref, c)
        np.array_equal(c.view(np.uint8), peer.view(np.uint8))
        ver.append(time.perf_counter() - t)
    m, v, p = statistics.median(mm), statistics.median(ver), statistics.median(prep)
    per_device = v + p / devices
    return {
        "n": n,
        "matmul_s": m,
        "verify_s": per_device,
        "check_s": v,
        "prepare_s": p,
        "devices": devices,
        "overhead": per_device / m,
    }


def main() -> int:
    t0 = time.monotonic()
    cov = coverage()
    ovh = [overhead(2048), overhead(4096)]
    figs = [
        figure(
            "ABFT detection, flips above the rounding bound",
            cov["all"]["abft_detected_above_tolerance"],
            "fraction",
            goal=">= 0.999",
            met=cov["all"]["abft_detected_above_tolerance"] >= 0.999,
            n=cov["all"]["above_tolerance"],
        ),
        figure(
            "ABFT + cross-device detection, all flips",
            cov["all"]["abft_plus_cross_detected"],
            "fraction",
            goal="= 1.0",
            met=cov["all"]["abft_plus_cross_detected"] == 1.0,
            n=cov["all"]["injections"],
        ),
        figure(
            "ABFT alone, all flips",
            cov["all"]["abft_detected"],
            "fraction",
            n=cov["all"]["injections"],
        ),
    ]
    for name in ("sign", "exponent", "mantissa"):
        figs.append(
            figure(
                f"ABFT alone, {name} bits",
                cov[name]["abft_detected"],
                "fraction",
                n=cov[name]["injections"],
            )
        )
    for o in ovh:
        figs.append(
            figure(
                f"verification overhead n={o['n']}",
                o["verify_s"],
                "s",
                baseline="matmul time",
                baseline_value=o["matmul_s"],
                goal="<= 3 % of matmul",
                met=o["overhead"] <= 0.03,
            )
        )
    write_result(
        "sdc",
        figs,
        {"coverage": cov, "overhead": ovh, "coverage_n": COVERAGE_N, "per_bit_injections": PER_BIT},
        duration_s=round(time.monotonic() - t0, 1),
    )
    lines = [
        "| bits | injections | ABFT alone | ABFT + cross-device | ABFT, flips above bound |",
        "|---|---|---|---|---|",
    ]
    for name in ("sign", "exponent", "mantissa", "all"):
        c = cov[name]
        lines.append(
            f"| {name} | {c['injections']} | {c['abft_detected']:.1%} | "
            f"{c['abft_plus_cross_detected']:.1%} | "
            f"{c['abft_detected_above_tolerance']:.1%} |"
        )
    lines.append("")
    for o in ovh:
        lines.append(
            f"n={o['n']}: matmul {o['matmul_s']:.3f} s, verify {o['verify_s']:.4f} s "
            f"= {o['overhead']:.2%}"
        )
    (RESULTS_DIR / "sdc.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
