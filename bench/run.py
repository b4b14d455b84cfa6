"""`make bench`: run every benchmark in its own process (with a time limit), then write
bench/RESULTS.md. A benchmark that fails is reported and the others still run; the run exits
non-zero, and the failed benchmark's older JSON is shown as FAILED in RESULTS.md, never as
today's result. A benchmark that exits 0 without writing its result counts as failed.

Run a subset by name: python -m bench.run sdc soak ettr"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.common import REPO, RESULTS_DIR

# (module, time limit in seconds). Explicit list: the order puts cheap ones first. Each module
# writes bench/results/<last part of its name>.json.
BENCHMARKS: list[tuple[str, int]] = [
    ("bench.sdc", 300),
    # make test-unit, make demo warm (3 runs) and cold (a fresh clone and venv): ~4 min
    ("bench.newcomer", 900),
    ("bench.agent_cost", 300),
    ("bench.fabric_scale", 300),
    # the tick beside fc1c4ca's: CPU and SQL statements per tick, 64 and 10,000 nodes (~3 min)
    ("bench.tick_cost", 900),
    # the soak on a fixed seed by the commit before the tick refactor and by this one: every
    # decision compared, benign noise and real faults (~8 min)
    ("bench.equivalence", 1800),  # a few seconds: correlation cost, 2k -> 32k nodes
    # real 10,000-node slurmctld (devcluster) with ingest at 2,000 reports/s
    ("bench.rack_failure", 900),
    ("bench.slurm_load", 1200),
    ("bench.alert_blackhole", 300),
    ("bench.ingest", 300),
    # the status page and /metrics at 1k and 10k nodes, and what 10 tabs + 2 scrapers cost
    # ingest at 2,000 reports/s (~6 min)
    ("bench.cockpit", 900),
    ("bench.fault_drain", 1800),
    # Slurm 25.11's expedited requeue against the plain one, a competing job waiting (~3 min)
    ("bench.expedite", 600),
    # fault -> back in service through reboot + validation, by phase (~3 min)
    ("bench.self_heal", 900),
    # the same at the shipped intervals (~3 min): the loop time ETTR's self-healing arm uses
    ("bench.self_heal_defaults", 900),
    # simulated fleets with benign noise at defaults: the false-drain rate (45 min budget)
    ("bench.soak", 3000),
    # NHC 1.4.3 beside babysitter on one devcluster: ~4 rounds at 60 s, 2 at 300 s (~20 min)
    ("bench.nhc", 2400),
    # last: it reads the latencies fault_drain and the false-drain bound soak just measured
    ("bench.ettr", 600),
]


def _utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _wrote_result(name: str, since: str, results_dir: Path) -> bool:
    """The benchmark wrote bench/results/<name>.json during this run."""
    try:
        doc = json.loads((results_dir / f"{name}.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str(doc.get("date", "")) >= since


def run_one(mod: str, limit: int, results_dir: Path) -> dict[str, Any]:
    name = mod.rsplit(".", 1)[-1]
    print(f"== {mod} (limit {limit} s)", flush=True)
    started, t0 = _utc(), time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", mod], cwd=REPO, timeout=limit)
        status = "ok" if r.returncode == 0 else f"exit status {r.returncode}"
    except subprocess.TimeoutExpired:
        status = f"exceeded its {limit} s limit"
    if status == "ok" and not _wrote_result(name, started, results_dir):
        status = f"exited 0 without writing results/{name}.json"
    took = round(time.monotonic() - t0, 1)
    print(f"== {mod}: {status} in {took:.0f} s", flush=True)
    return {"status": status, "started": started, "seconds": took}


def main(
    argv: list[str],
    benchmarks: list[tuple[str, int]] | None = None,
    results_dir: Path = RESULTS_DIR,
    out: Path | None = None,
) -> int:
    only = set(argv)
    runs: dict[str, dict[str, Any]] = {}
    started = _utc()
    for mod, limit in benchmarks if benchmarks is not None else BENCHMARKS:
        if only and mod.rsplit(".", 1)[-1] not in only:
            continue
        runs[mod.rsplit(".", 1)[-1]] = run_one(mod, limit, results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / report.LAST_RUN).write_text(
        json.dumps({"started": started, "benchmarks": runs}, indent=2) + "\n"
    )
    report.main(results_dir, out or results_dir.parent / "RESULTS.md")
    failed = [n for n, r in runs.items() if r["status"] != "ok"]
    if failed:
        print("benchmarks that failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
