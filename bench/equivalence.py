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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import REPO, figure, write_result

# The base: the last commit whose decisions changed on purpose (b7cbaa6: one XID is one event
# for the escalation; f085679: a GPU reset ends the kernel-log XIDs logged before it). Before
# those, 3d2108c decided identically to a3f8745, the last commit before the tick was split by
# stage and read once (fb13c71 recorded it); since, the tick's statements were cut again
BASE = "c1f9fe2"
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


NOISES = {  # the soak's benign noise, then the same with real faults (drains, the ladder)
    "benign": REPO / "bench" / "data" / "soak_noise.toml",
    "faults": REPO / "bench" / "data" / "equivalence_noise.toml",
}


# The soak of a tree whose bench/soak.py left the agents' stamps on the wall clock (before
# _agent_clocks): every finding's observed_at was the minute of the real run, so past 24
# simulated hours the controller's XID window counted by how fast the run had gone and two runs
# of one seed differed. The same fix, from outside; a tree that has it runs as it is.
SOAK = """
import sys, time
from contextlib import ExitStack
from types import SimpleNamespace
from unittest import mock
import bench.soak as s

class Time(SimpleNamespace):
    def __getattr__(self, name):
        return getattr(time, name)

def virtual(f):
    def run(self, *a, **kw):
        with ExitStack() as stack:
            stack.enter_context(mock.patch("babysitter.finding.utcnow", self.clock.now))
            stack.enter_context(mock.patch("babysitter.agent.daemon.time", Time(time=self.clock)))
            return f(self, *a, **kw)
    return run

if not hasattr(s, "_agent_clocks"):
    s.Soak._make_node = virtual(s.Soak._make_node)
    s.Soak.run = virtual(s.Soak.run)
raise SystemExit(s.main(sys.argv[1:]))
"""


def _soak(
    tree: Path, out: Path, nodes: int, days: float, noise: Path
) -> tuple[dict[str, Any], list[Any]]:
    log = out / "decisions"
    args = ["--nodes", str(nodes), "--days", str(days), "--budget-s", "3000"]
    args += ["--noise", str(noise)]
    args += ["--workers", "1", "--decision-log", str(log), "--results", str(out)]
    r = subprocess.run(
        [sys.executable, "-c", SOAK, *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if r.returncode != 0:
        raise SystemExit(f"soak failed in {tree}:\n{r.stderr[-3000:]}")
    doc = json.loads((out / "soak.json").read_text())
    # a drain's and a requeue's time since the run's start: each run starts on the hour it
    # began in, and a base and a head run either side of an hour differed by 3,600 s in each
    t0 = doc["settings"]["t0"]
    for k in ("drains", "interruptions"):
        doc["details"][k] = [{**x, "t": x["t"] - t0} for x in doc["details"].get(k, [])]
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
        runs: dict[str, Any] = {}
        try:
            # the base's and the head's soak side by side: each is one worker (one core), and
            # neither's decisions depend on how fast it runs (virtual time)
            with ThreadPoolExecutor(2) as pool:
                for name, noise in NOISES.items():
                    base = pool.submit(
                        _soak, base_tree, Path(tmp) / f"b-{name}", a.nodes, a.days, noise
                    )
                    head = _soak(REPO, Path(tmp) / f"h-{name}", a.nodes, a.days, noise)
                    runs[name] = (base.result(), head)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)],
                capture_output=True,
            )
    figs, details, same = [], {}, True
    for name, ((base, base_log), (head, head_log)) in runs.items():
        diff = _compare(base, base_log, head, head_log)
        same = same and not diff
        print(
            f"{name}: {len(base_log)} decisions (base) vs {len(head_log)} (head), "
            f"{len(head.get('drains', []))} drains: {'DIFFERENT' if diff else 'identical'}"
        )
        for line in diff[:20]:
            print("  " + line)
        figs.append(
            figure(
                f"decisions compared, fixed seed, {name} noise",
                len(head_log),
                "decisions",
                baseline=a.base,
                baseline_value=len(base_log),
                goal="identical",
                met=not diff,
            )
        )
        details[name] = {
            "differences": diff[:50],
            "drains": len(head.get("drains", [])),
            "interruptions": len(head.get("interruptions", [])),
            "decision_kinds": head.get("decisions", {}),
        }
    write_result(
        "equivalence", figs, details, settings={"base": a.base, "nodes": a.nodes, "days": a.days}
    )
    return 0 if same else 1


def _compare(
    base: dict[str, Any], base_log: list[Any], head: dict[str, Any], head_log: list[Any]
) -> list[str]:
    diff = differences(base, head)
    first = next(
        (i for i, (x, y) in enumerate(zip(base_log, head_log, strict=False)) if x != y), None
    )
    if first is None and len(base_log) != len(head_log):
        first = min(len(base_log), len(head_log))
    if first is not None:
        diff.insert(
            0,
            f"decision {first}: base {base_log[first : first + 1]} "
            f"head {head_log[first : first + 1]}",
        )
    return diff


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
