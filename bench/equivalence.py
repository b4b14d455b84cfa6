"""Proof that a refactor of the tick changed nothing but its cost (issue 52): the soak on one
fixed seed, run by an earlier commit and by this tree, each with its own code on PYTHONPATH,
compared decision by decision (virtual time, node, kind, rule, reason), and on its drains,
job interruptions, alerts and everything else the soak counts. Wall times and the cost
counters are the only things allowed to differ.

    python -m bench.equivalence [BASE_REF] [--nodes N] [--days D]

Exit 0 when identical; 1 with the first differences printed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import REPO, figure, write_result

BASE = "a3f8745"  # the last commit before the tick was split by stage and read once
COMPARED = (
    "nodes",
    "node_days",
    "injected",
    "decisions",
    "drains",
    "interruptions",
    "drained_node_hours",
    "drains_resumed",
    "drains_open_at_end",
    "false_drains",
    "false_interruptions",
    "alerts",
    "alert_conditions",
    "alerts_firing_at_end",
    "open_at_end",
    "nodes_open_at_end",
    "ticks",
    "reports",
    "check_runs",
)


def _soak(tree: Path, out: Path, nodes: int, days: float) -> tuple[dict[str, Any], list[Any]]:
    log = out / "decisions"
    args = ["--nodes", str(nodes), "--days", str(days), "--budget-s", "3000"]
    args += ["--workers", "1", "--decision-log", str(log), "--results", str(out)]
    r = subprocess.run(
        [sys.executable, "-m", "bench.soak", *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if r.returncode != 0:
        raise SystemExit(f"soak failed in {tree}:\n{r.stderr[-3000:]}")
    doc = json.loads((out / "soak.json").read_text())
    rows = []
    for p in sorted(log.glob("shard-*.jsonl")):
        rows += [json.loads(line) for line in p.read_text().splitlines()]
    return doc["details"], rows


def differences(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """The compared keys whose values differ (a key one side lacks is skipped: it counts
    something new, not a decision that changed)."""
    return [
        f"{k}: base {base[k]!r:.300} head {head[k]!r:.300}"
        for k in COMPARED
        if k in base and k in head and base[k] != head[k]
    ]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", nargs="?", default=BASE)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--days", type=float, default=2.0)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(base_tree), a.base],
            check=True,
            capture_output=True,
        )
        try:
            base, base_log = _soak(base_tree, Path(tmp) / "b", a.nodes, a.days)
            head, head_log = _soak(REPO, Path(tmp) / "h", a.nodes, a.days)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)],
                capture_output=True,
            )
    diff = differences(base, head)
    first = next(
        (i for i, (x, y) in enumerate(zip(base_log, head_log, strict=False)) if x != y), None
    )
    if first is None and len(base_log) != len(head_log):
        first = min(len(base_log), len(head_log))
    if first is not None:
        diff.insert(
            0,
            f"decision {first}: base {base_log[first : first + 1]} head "
            f"{head_log[first : first + 1]}",
        )
    same = not diff
    print(
        f"{len(base_log)} decisions (base) vs {len(head_log)} (head): "
        f"{'identical' if same else 'DIFFERENT'}"
    )
    for line in diff[:20]:
        print("  " + line)
    write_result(
        "equivalence",
        [
            figure(
                "decisions compared, fixed seed",
                len(head_log),
                "decisions",
                baseline=a.base,
                baseline_value=len(base_log),
                goal="identical",
                met=same,
            ),
        ],
        {
            "differences": diff[:50],
            "drains": len(head.get("drains", [])),
            "interruptions": len(head.get("interruptions", [])),
        },
        settings={"base": a.base, "nodes": a.nodes, "days": a.days},
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
