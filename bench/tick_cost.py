"""The controller's tick, side by side with an earlier commit (issue 52): CPU per tick and SQL
statements per tick, at 64 nodes (a babysat job on each) steady and while it handles one
node's fault, and the steady tick at 10,000 nodes. Both arms run the same probe on the same
in-memory Slurm stand-in, each in its own process with its own tree on PYTHONPATH, taking
turns (base, head, base, head, ...) so both meet the same machine load.

    python -m bench.tick_cost [BASE_REF]   (default fc1c4ca, the commit the issue names)"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import REPO, figure, summary, write_result

BASE = "fc1c4ca"
ROUNDS = 5  # turns per arm at 64 nodes
STEADY_TICKS = 40  # steady ticks measured per turn

# Runs inside the measured tree (its own babysitter and bench on PYTHONPATH): only names that
# both the base and the head export.
PROBE = r"""
import json, sys, tempfile, time, uuid
from datetime import UTC, datetime
from pathlib import Path
from sqlalchemy import event
from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.store import Store
from babysitter.controller.loop.remediation import make_engine
from babysitter.finding import Finding
from babysitter.report import Report
from babysitter.slurm.client import SlurmJob
from bench.slurm_standin import InMemorySlurm

n, ticks, fault = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
store = Store(f"sqlite:///{Path(tempfile.mkdtemp()) / 's.db'}")
store.upgrade()
names = [f"n{i:05d}" for i in range(n)]
now = datetime.now(UTC)
rep = lambda x, *f: Report(node=x, report_id=str(uuid.uuid4()), sent_at=now, findings=list(f),
                           metrics={})
for k in range(0, n, 2000):
    ReportWriter(store).write([rep(x) for x in names[k : k + 2000]])
slurm = InMemorySlurm(names)
for j in range(min(n, 64)):
    slurm.add_job(SlurmJob(j + 1, states=("RUNNING",), nodes=(names[j],),
                           comment="babysit=ckpt=/x"))
eng = make_engine(parse_config({"checks": {"sdc": {"enabled": False}}}), store, slurm=slurm)
count = [0]
event.listen(store.engine, "before_cursor_execute", lambda *a: count.__setitem__(0, count[0] + 1))

def tick():
    count[0] = 0
    t = time.process_time()
    eng.tick()
    return time.process_time() - t, count[0]

for _ in range(3):
    tick()
steady = [tick() for _ in range(ticks)]
out = {"steady_cpu_s": [c for c, _ in steady], "steady_sql": [s for _, s in steady]}
if fault:
    dbe = Finding(check="gpu.memory", component="gpu3", severity="critical",
                  code="ecc.dbe.volatile", message="GPU 3: 1 volatile uncorrected ECC error",
                  action="reset_gpu")
    ReportWriter(store).write([rep(names[0], dbe)])
    faulty = [tick() for _ in range(3)]
    out |= {"fault_cpu_s": [c for c, _ in faulty], "fault_sql": [s for _, s in faulty]}
print(json.dumps(out))
"""


def _probe(tree: Path, nodes: int, ticks: int, fault: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(nodes), str(ticks), "1" if fault else "0"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=1200,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _base_tree(ref: str, where: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(where), ref],
        check=True,
        capture_output=True,
    )
    return where


def main(argv: list[str]) -> int:
    ref = argv[0] if argv else BASE
    base_sha = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", ref], capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        base = _base_tree(ref, Path(tmp) / "base")
        try:
            runs: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
            for _ in range(ROUNDS):
                for arm, tree in (("base", base), ("head", REPO)):
                    runs[arm].append(_probe(tree, 64, STEADY_TICKS, fault=True))
            big = {
                arm: _probe(tree, 10_000, 5, False)
                for arm, tree in (("base", base), ("head", REPO))
            }
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)],
                capture_output=True,
            )
    figs, details = _figures(runs, big, base_sha)
    for f in figs:
        print(f"{f['metric']}: {f['value']:.4g} {f['unit']} (base {f.get('baseline_value')})")
    write_result("tick_cost", figs, details, settings={"base": base_sha, "rounds": ROUNDS})
    return 0


def _figures(
    runs: dict[str, list[dict[str, Any]]], big: dict[str, dict[str, Any]], base_sha: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    def pooled(arm: str, key: str) -> list[float]:
        return [v for r in runs[arm] for v in r[key]]

    steady = {arm: statistics.median(pooled(arm, "steady_cpu_s")) * 1000 for arm in runs}
    fault = {arm: statistics.median(pooled(arm, "fault_cpu_s")) * 1000 for arm in runs}
    sql = {arm: max(pooled(arm, "steady_sql")) for arm in runs}
    fsql = {arm: max(pooled(arm, "fault_sql")) for arm in runs}
    big_ms = {arm: statistics.median(big[arm]["steady_cpu_s"]) * 1000 for arm in big}
    label = f"{base_sha} (same probe, same run)"
    figs = [
        figure(
            "tick CPU, 64 nodes, steady, p50",
            steady["head"],
            "ms",
            baseline=label,
            baseline_value=steady["base"],
            cheaper=steady["base"] / steady["head"],
        ),
        figure(
            "tick CPU, 64 nodes, handling a fault, p50",
            fault["head"],
            "ms",
            baseline=label,
            baseline_value=fault["base"],
            cheaper=fault["base"] / fault["head"],
        ),
        figure(
            "SQL statements per steady tick, 64 nodes, max",
            sql["head"],
            "statements",
            baseline=label,
            baseline_value=sql["base"],
        ),
        figure(
            "SQL statements per tick handling a fault, 64 nodes, max",
            fsql["head"],
            "statements",
            baseline=label,
            baseline_value=fsql["base"],
        ),
        figure(
            "tick CPU, 10,000 nodes, steady, p50",
            big_ms["head"],
            "ms",
            baseline=label,
            baseline_value=big_ms["base"],
            goal="<= 20 ms",
            met=big_ms["head"] <= 20,
        ),
    ]
    details = {
        "steady_cpu_ms": {a: summary([v * 1000 for v in pooled(a, "steady_cpu_s")]) for a in runs},
        "fault_cpu_ms": {a: summary([v * 1000 for v in pooled(a, "fault_cpu_s")]) for a in runs},
        "steady_10k_cpu_ms": {a: [v * 1000 for v in big[a]["steady_cpu_s"]] for a in big},
    }
    return figs, details


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
