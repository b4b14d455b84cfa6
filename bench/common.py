"""Shared benchmark plumbing: every benchmark writes bench/results/<name>.json in one format,
and bench/report.py turns them into bench/RESULTS.md.

Result format:
    {"name": ..., "machine": {...}, "date": ..., "commit": ..., "dirty": ..., "settings": {...},
     "measures": [...], "load_average": {"start": [...], "end": [...]}, "duration_s": ...,
     "figures": [{"metric", "value", "unit", "baseline"?, "baseline_value"?, "ratio"?,
                  "p50"?, "p99"?, "spread"?, "n"?, "goal"?, "met"?}],
     "details": {...}}

Provenance (bench/provenance.py): the machine, the commit and whether the tree was dirty, the
paths of the code the result measures (to mark it STALE once that code changes), the settings
the run used, and the load average when the benchmark started and ended (a shared machine).
A figure that could not be measured this run (Postgres down) is written with "missing": why.

Figures are measured beside their baseline in the same run (machines here are noisy); "goal" is a
human-readable target like "<= 1 s" and "met" says whether this run reached it. Goals are never
asserted in tests: a missed goal is shown loudly in RESULTS.md.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench import provenance

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
REPO = provenance.REPO


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); robust for the small samples benchmarks take."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, p50/p99 and spread (IQR) of a sample."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": statistics.median(values),
        "p99": percentile(values, 99),
        "min": min(values),
        "max": max(values),
        "spread": percentile(values, 75) - percentile(values, 25),
    }


def figure(
    metric: str,
    value: float,
    unit: str,
    *,
    baseline: str | None = None,
    baseline_value: float | None = None,
    goal: str | None = None,
    met: bool | None = None,
    **extra: Any,
) -> dict[str, Any]:
    f: dict[str, Any] = {"metric": metric, "value": value, "unit": unit}
    if baseline is not None:
        f["baseline"] = baseline
        f["baseline_value"] = baseline_value
        if baseline_value:
            f["ratio"] = value / baseline_value
    if goal is not None:
        f["goal"] = goal
        f["met"] = bool(met)
    f.update(extra)
    return f


def missing(metric: str, unit: str, why: str) -> dict[str, Any]:
    """A figure this run could not measure: shown as MISSING, never dropped."""
    return {"metric": metric, "value": None, "unit": unit, "missing": why}


# the load when this process imported the module: benchmarks run one per process
_LOAD_AT_START = provenance.load_average()


def write_result(
    name: str,
    figures: list[dict[str, Any]],
    details: dict[str, Any] | None = None,
    *,
    settings: dict[str, Any] | None = None,
    results_dir: Path | None = None,
    **kw: Any,
) -> Path:
    results_dir = results_dir or RESULTS_DIR
    results_dir.mkdir(parents=True, exist_ok=True)
    src = provenance.source()
    doc = {
        "name": name,
        "machine": provenance.machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": src["commit"],
        "dirty": src["dirty"],
        "dirty_paths": src["dirty_paths"],
        "measures": list(provenance.MEASURES.get(name, ())),
        "settings": settings or {},
        "load_average": {"start": _LOAD_AT_START, "end": provenance.load_average()},
        "figures": figures,
        "details": details or {},
        **kw,
    }
    path = results_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.start


def wait_until(
    cond: Callable[[], bool], timeout: float, *, poll: float = 0.2, what: str = "a condition"
) -> float:
    """Poll `cond` until it holds; the seconds that took. A benchmark that goes on after a
    timeout measures a broken set-up, so a timeout raises (TimeoutError naming `what`)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)
    return time.monotonic() - t0


def wait_ready(
    url: str,
    timeout: float = 60,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Until the controller at `url` answers /readyz with 200. A controller process that
    exits meanwhile fails at once (RuntimeError, with the end of its log); a timeout raises."""

    def ready() -> bool:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"controller exited with {proc.returncode} before ready: {tail}")
        try:
            return httpx.get(url + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, timeout, poll=0.1, what=f"{url}/readyz")
