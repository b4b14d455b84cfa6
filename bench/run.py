"""`make bench`: run every benchmark in its own process (with a time limit), then write
bench/RESULTS.md. A benchmark that fails is reported and the others still run."""

from __future__ import annotations

import subprocess
import sys
import time

from bench import report
from bench.common import REPO

# (module, time limit in seconds). Explicit list: the order puts cheap ones first.
BENCHMARKS: list[tuple[str, int]] = [
    ("bench.sdc", 300),
    ("bench.agent_cost", 300),
    # real 10,000-node slurmctld (devcluster) with ingest at 2,000 reports/s
    ("bench.rack_failure", 900),
    ("bench.slurm_load", 1200),
    ("bench.alert_blackhole", 300),
    ("bench.ingest", 300),
    ("bench.fault_drain", 1800),  # ~25 min: 20 injections x 8 faults, defaults + reference
    # last: it reads the latencies fault_drain just measured
    ("bench.ettr", 600),
]


def append_sections() -> None:
    """Benchmarks whose result is more than one table (the ETTR simulation) write a Markdown
    section to bench/results/<name>.md; it goes under the main table of RESULTS.md."""
    path = REPO / "bench" / "RESULTS.md"
    for name in ("ettr",):
        section = REPO / "bench" / "results" / f"{name}.md"
        if section.exists() and path.exists():
            with path.open("a") as f:
                f.write("\n" + section.read_text())


def main(argv: list[str]) -> int:
    only = set(argv)
    failed = []
    for mod, limit in BENCHMARKS:
        if only and mod.split(".")[-1] not in only:
            continue
        print(f"== {mod} (limit {limit} s)", flush=True)
        start = time.monotonic()
        try:
            r = subprocess.run([sys.executable, "-m", mod], cwd=REPO, timeout=limit)
            ok = r.returncode == 0
        except subprocess.TimeoutExpired:
            print(f"!! {mod} exceeded {limit} s", flush=True)
            ok = False
        print(f"== {mod}: {'ok' if ok else 'FAILED'} in {time.monotonic() - start:.0f} s")
        if not ok:
            failed.append(mod)
    report.main()
    append_sections()
    if failed:
        print("benchmarks that failed to run: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
