"""Confidence bounds on a Poisson rate (events per exposure) and a nearest-rank quantile: what
the soak (bench/soak.py) reports and the ETTR model (bench/ettr.py) charges each arm with."""

from __future__ import annotations

import math


def poisson_upper(k: int, exposure: float, conf: float = 0.95) -> float:
    """One-sided upper confidence bound on a Poisson rate after k events in `exposure`; with
    k = 0 this is -ln(0.05) / exposure = 2.996 / exposure (the rule of three)."""

    def cdf(lam: float) -> float:
        return _cdf(k, lam)

    lo, hi = 0.0, 10.0 + 10.0 * k
    for _ in range(200):  # bisection: cdf falls with lambda
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 1 - conf else (lo, mid)
    return hi / exposure


def poisson_interval(k: int, exposure: float, conf: float = 0.95) -> tuple[float, float]:
    """Two-sided (Garwood, exact) confidence interval on a Poisson rate after k events in
    `exposure`: each end is a one-sided bound at (1 + conf) / 2; the lower end is 0 at k = 0."""
    tail = (1 + conf) / 2
    lower = 0.0 if k == 0 else _poisson_lower(k, tail) / exposure
    return lower, poisson_upper(k, exposure, tail)


def _poisson_lower(k: int, conf: float) -> float:
    """The lambda at which P(X >= k) = 1 - conf (k >= 1)."""

    def sf(lam: float) -> float:  # P(X >= k)
        return 1.0 - _cdf(k - 1, lam)

    lo, hi = 0.0, 10.0 + 10.0 * k
    for _ in range(200):  # bisection: sf rises with lambda
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sf(mid) < 1 - conf else (lo, mid)
    return lo


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by the nearest-rank method (a value that occurred), 0 for no values."""
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def _cdf(k: int, lam: float) -> float:
    """P(X <= k) for X ~ Poisson(lam), summed in log space: the plain product underflows
    (exp(-lam) is 0 past lam ~ 745), which made every bound of a count in the hundreds wrong."""
    if lam <= 0.0:
        return 1.0
    logs = [-lam + i * math.log(lam) - math.lgamma(i + 1) for i in range(k + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs))
