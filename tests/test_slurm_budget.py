"""The controller's Slurm budget: a tick's Slurm calls do not grow with the cluster. Counted on
the in-memory Slurm stand-in (bench/slurm_standin.py: a 10,000-node slurmctld per test is too
slow here; the real one is measured by bench/slurm_load.py and tests/test_devcluster_scale.py),
which records every client call."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from babysitter.config import Config
from babysitter.controller.ingest import ReportWriter
from babysitter.controller.remediation import make_engine
from babysitter.controller.store import Store
from babysitter.finding import Finding
from babysitter.report import Report
from babysitter.slurm.client import SlurmJob
from bench.slurm_standin import InMemorySlurm

DBE = Finding(
    check="gpu.memory",
    component="gpu3",
    severity="critical",
    code="ecc.dbe.volatile",
    message="GPU 3: 1 volatile uncorrected ECC error",
    action="reset_gpu",
)


def _calls(tmp_path: Path, n: int, failing: int) -> tuple[Counter[str], Counter[str], int]:
    """(calls of 3 steady ticks, calls of the tick that handles `failing` nodes failing alike,
    nodes drained)."""
    store = Store(f"sqlite:///{tmp_path / f'{n}.db'}")
    store.upgrade()
    names = [f"n{i:05d}" for i in range(n)]
    now = datetime.now(UTC)
    for k in range(0, n, 2000):
        ReportWriter(store).write(
            [
                Report(node=x, report_id=str(uuid.uuid4()), sent_at=now, findings=[], metrics={})
                for x in names[k : k + 2000]
            ]
        )
    slurm = InMemorySlurm(names)
    for j in range(3):  # babysat jobs on the nodes that will fail
        slurm.add_job(
            SlurmJob(j + 1, states=("RUNNING",), nodes=(names[j],), comment="babysit=ckpt=/x")
        )
    # every tick re-reads nodes and jobs: the worst case for the budget
    cfg = Config.model_validate(
        {
            "policy": {"max_drained_fraction": 1.0, "max_drains_per_hour": 1000},
            "slurm": {"node_refresh_s": 0, "job_scan_s": 0},
        }
    )
    engine = make_engine(cfg, store, slurm=slurm)
    engine.tick()
    slurm.calls.clear()
    for _ in range(3):
        engine.tick()
    steady = Counter(op for op, _ in slurm.calls)
    slurm.calls.clear()
    ReportWriter(store).write(
        [
            Report(node=x, report_id=str(uuid.uuid4()), sent_at=now, findings=[DBE], metrics={})
            for x in names[:failing]
        ]
    )
    engine.tick()
    failure = Counter(op for op, _ in slurm.calls)
    drained = sum(1 for x in slurm.nodes() if x.drained_or_draining)
    store.close()
    return steady, failure, drained


def test_tick_slurm_calls_do_not_grow_with_cluster_size(tmp_path):
    small_steady, small_fail, small_drained = _calls(tmp_path, 50, failing=4)
    big_steady, big_fail, big_drained = _calls(tmp_path, 10_000, failing=32)
    assert (small_drained, big_drained) == (4, 32)
    assert small_steady == big_steady
    assert sum(big_steady.values()) <= 2 * 3  # one node snapshot + one job listing per tick
    # 4 or 32 nodes failing alike: one batched drain and one job listing for all of them
    assert small_fail == big_fail
    assert big_fail["drain_many"] == 1 and big_fail["drain"] == 0


def test_fast_node_line_parse_matches_the_general_one():
    """cli's node_line reads only the keys it needs; same nodes as parse.node_from_scontrol."""
    from babysitter.slurm import parse
    from babysitter.slurm.cli import node_line

    data = Path(__file__).parent / "data" / "slurm" / "22.05" / "scontrol_show_node.txt"
    lines = [x for x in data.read_text().splitlines() if x.startswith("NodeName=")]
    assert lines
    extra = [
        lines[0].replace("State=IDLE", "State=IDLE+DRAIN") + " Reason=babysitter: a b [root@t]",
        lines[0].replace("State=IDLE", "State=DOWN*") + " Reason=Not responding [slurm@t]",
    ]
    for line in lines + extra:
        assert node_line(line) == parse.node_from_scontrol(line)
