"""bench/cockpit.py in its quick mode (tiny fleets, windows of seconds): the benchmark that
measures what the status page and /metrics cost ingest runs end to end, so it cannot rot. Its
figures mean nothing at this size; only that each was measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.common import REPO


def test_the_cockpit_bench_measures_every_figure_in_quick_mode(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "-m", "bench.cockpit", "--quick", "--results-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "cockpit_quick.json").read_text())
    names = {f["metric"]: f["value"] for f in doc["figures"]}
    for metric in (
        "ingest p99 with readers / without (same run)",
        "/ui median, 200 nodes",
        "/metrics bytes, 200 nodes",
        "/metrics controller CPU per scrape, 60 nodes",
    ):
        assert names.get(metric) is not None, (metric, sorted(names))
    ingest = doc["details"]["ingest"]
    seen = ingest["reader_requests"]
    # the tabs and the scraper were answered (200, or 304 for an unchanged page)
    assert seen["ui"]["n"] > 0 and set(seen["ui"]["statuses"]) <= {200, 304}, ingest
    assert seen["metrics"]["n"] > 0 and seen["metrics"]["statuses"] == [200], ingest
    # reports were answered in every window (a refused one counts as an error)
    assert ingest["quiet"]["n"] > 0 and ingest["readers"]["n"] > 0, ingest
