"""Algorithm-based fault tolerance for C = A·B (Huang & Abraham, 1984).

Checks, in float64: eᵀC against (eᵀA)B (column sums) and Ce against A(Be) (row sums). The
tolerance is the standard forward error bound of a floating-point dot product of length n,
|fl(x·y) − x·y| ≤ γ_n |x|·|y| with γ_n = n·u / (1 − n·u), plus the rounding of each result to
the output dtype (u·|c|). Summed over a column, the bound for column j is
(γ_n + u) · ((eᵀ|A|)|B|)_j, and likewise for rows. u is the unit roundoff of the dtype the
matmul ran in. No constant is guessed; a flip that changes a sum by less than this bound is
below what rounding alone can explain and is left to the cross-device comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}


def gamma(n: int, u: float) -> float:
    nu = n * u
    return nu / (1 - nu) if nu < 1 else float("inf")


@dataclass
class AbftResult:
    ok: bool
    worst_ratio: float  # max |checksum difference| / tolerance (<= 1 means within bound)
    bad_rows: list[int]
    bad_cols: list[int]


@dataclass
class Reference:
    """What every device's C is checked against: depends only on A and B, so it is computed once
    per (seed, size, dtype) and cached (runner.cached_reference); the per-device cost is two
    BLAS reductions over C."""

    col_ref: np.ndarray
    col_tol: np.ndarray
    row_ref: np.ndarray
    row_tol: np.ndarray


# The per-device checksums eᵀC and Ce are summed in SUM_DTYPE (C's own precision; float16 is
# summed in float32): on the host with BLAS, on a GPU with the framework's sum reduction. Any
# summation order in precision u_s (or finer) adds at most γ_m(u_s)·eᵀ|C| ≤
# γ_m(u_s)·(1 + g)·(eᵀ|A|)|B| (since |C| ≤ (1 + g)|A||B| elementwise), so the tolerance per
# column is (g + γ_m(u_s)(1 + g))·((eᵀ|A|)|B|)_j, all known before any device runs. Devices use a
# plain sum, not a matmul with a ones vector, so a TF32/reduced-precision GEMM mode cannot
# loosen it.
SUM_DTYPE = {"float64": np.float64, "float32": np.float32, "float16": np.float32}


# Bump when prepare()'s output changes, so cached references (runner.reference) are recomputed.
REFERENCE_VERSION = 2

# Rows of A/B converted to float64 per step: ~1 MiB blocks stay in cache, instead of full float64
# copies of A, B, |A| and |B| (4x faster at n=2048, same float64 arithmetic).
_BLOCK_BYTES = 1 << 20


def prepare(a: np.ndarray, b: np.ndarray, dtype: str) -> Reference:
    u = UNIT_ROUNDOFF[dtype]
    n = a.shape[1]
    g = gamma(n, u) + u
    u_sum = UNIT_ROUNDOFF["float64" if SUM_DTYPE[dtype] is np.float64 else "float32"]
    factor = g + gamma(max(a.shape[0], b.shape[1]), u_sum) * (1 + g)
    f64 = np.float64
    m, p = a.shape[0], b.shape[1]
    blk = max(1, _BLOCK_BYTES // (8 * max(n, p)))
    # Be and |B|e
    b_row, b_abs_row = np.empty(n), np.empty(n)
    for i in range(0, n, blk):
        bb = b[i : i + blk].astype(f64)
        b_row[i : i + blk] = bb.sum(axis=1)
        b_abs_row[i : i + blk] = np.abs(bb, out=bb).sum(axis=1)
    # A(Be), |A|(|B|e), eᵀA and eᵀ|A|
    row_ref, row_tol = np.empty(m), np.empty(m)
    a_col, a_abs_col = np.zeros(n), np.zeros(n)
    for i in range(0, m, blk):
        ab = a[i : i + blk].astype(f64)
        row_ref[i : i + blk] = ab @ b_row
        a_col += ab.sum(axis=0)
        np.abs(ab, out=ab)
        row_tol[i : i + blk] = ab @ b_abs_row
        a_abs_col += ab.sum(axis=0)
    # (eᵀA)B and (eᵀ|A|)|B|
    col_ref, col_tol = np.zeros(p), np.zeros(p)
    for i in range(0, n, blk):
        bb = b[i : i + blk].astype(f64)
        col_ref += a_col[i : i + blk] @ bb
        col_tol += a_abs_col[i : i + blk] @ np.abs(bb, out=bb)
    return Reference(col_ref, factor * col_tol + 1e-300, row_ref, factor * row_tol + 1e-300)


def checksums(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """eᵀC and Ce on the host, in SUM_DTYPE (what devices compute on their side)."""
    cs = c if c.dtype == SUM_DTYPE.get(str(c.dtype), c.dtype) else c.astype(np.float32)
    ones_r = np.ones(cs.shape[0], dtype=cs.dtype)
    ones_c = np.ones(cs.shape[1], dtype=cs.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        return ones_r @ cs, cs @ ones_c


def check_sums(ref: Reference, col: np.ndarray, row: np.ndarray) -> AbftResult:
    """Compare column sums eᵀC and row sums Ce (from the host or a device) with the reference."""
    col, row = np.asarray(col, np.float64), np.asarray(row, np.float64)
    if col.shape != ref.col_ref.shape or row.shape != ref.row_ref.shape:
        raise ValueError(f"checksum shapes {col.shape}, {row.shape} do not fit the reference")
    # NaN/inf in C propagate into the sums, so no separate finiteness pass is needed
    with np.errstate(invalid="ignore", over="ignore"):
        col_ratio = np.abs(col - ref.col_ref) / ref.col_tol
        row_ratio = np.abs(row - ref.row_ref) / ref.row_tol
    col_bad = ~(col_ratio <= 1)  # NaN counts as bad
    row_bad = ~(row_ratio <= 1)
    bad_cols = np.where(col_bad)[0].tolist()
    bad_rows = np.where(row_bad)[0].tolist()
    ratios = np.concatenate([col_ratio, row_ratio])
    worst = float(np.nan_to_num(ratios, nan=np.inf).max(initial=0))
    return AbftResult(not bad_cols and not bad_rows, worst, bad_rows[:16], bad_cols[:16])


def check(ref: Reference, c: np.ndarray) -> AbftResult:
    return check_sums(ref, *checksums(c))


def verify(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype: str) -> AbftResult:
    return check(prepare(a, b, dtype), c)


def check_bit(bit: int, itemsize: int, dtype: object) -> None:
    """A fault-injection bit must lie inside the element."""
    if not 0 <= bit < itemsize * 8:
        raise ValueError(f"bit must be in 0..{itemsize * 8 - 1} for {dtype}")


def flip_bit(c: np.ndarray, i: int, j: int, bit: int) -> None:
    """Flip one bit of C[i, j] in place (bit 0 = least significant mantissa bit). Works on any
    array with numpy's view API: numpy on the host, cupy on its GPU."""
    check_bit(bit, c.dtype.itemsize, c.dtype)
    view = c.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[c.dtype.itemsize])
    view[i, j] ^= view.dtype.type(1) << view.dtype.type(bit)
