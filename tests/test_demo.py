"""`babysitter demo` runs the whole story, exits 0 with its summary line, and leaves nothing
running."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_cleans_up(tmp_path):
    base = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "demo", "--base", str(base)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "demo ok" in r.stdout
    for needle in ("node drained", "job requeued", "alert sent", "node resumed"):
        assert needle in r.stdout
    assert not base.exists()  # cleaned up
    left = subprocess.run(
        ["pgrep", "-a", "-f", str(base)], capture_output=True, text=True, timeout=30
    )
    assert left.stdout.strip() == "", left.stdout
