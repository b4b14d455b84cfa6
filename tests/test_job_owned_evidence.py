"""Job-owned evidence (issue 42): a line any user can print into a job's log is evidence about
that job, never about its node, switch or domain. `echo "transport retry counter exceeded"` in
the log of a job spanning 32 nodes under 4 leaves and a spine, reported by every node's agent:
the real remediation engine (policy, fabric correlation, executor) drains nothing, opens no
switch incident, excludes no node, and the job's alert still fires. The babysat job itself is
requeued once (issue 51: its own NCCL's network failure is evidence about the job)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from babysitter.checks.nccl.check import JobLogScanner
from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.fabric import is_fabric, onsets
from babysitter.controller.loop.decide.link_hold import critical
from babysitter.controller.loop.remediation import make_engine
from babysitter.finding import Finding, job_owned
from babysitter.report import Report
from babysitter.slurm.client import SlurmJob
from babysitter.slurm.topology import Topology, tree
from bench.slurm_standin import InMemorySlurm

LEAVES = {f"leaf{i}": [f"n{i * 8 + k:02d}" for k in range(8)] for i in range(4)}
NODES = [n for ns in LEAVES.values() for n in ns]
JOB = 4242


class TopologySlurm(InMemorySlurm):
    """The in-memory Slurm with a fat tree: 4 leaves of 8 nodes under one spine."""

    def topology(self) -> Topology:
        return tree(LEAVES)


def job_line_finding(tmp_path: Path, node: str) -> Finding:
    """What each node's NCCL log check makes of the user's one line (the shared glob: every
    agent read the same file before issue 42)."""
    log = tmp_path / f"slurm-{JOB}.out"
    log.write_text("transport retry counter exceeded\n")
    [f] = JobLogScanner().scan(str(JOB), log, node)
    return f


def test_a_job_log_line_is_the_jobs_evidence_never_the_fabrics(tmp_path: Path):
    f = job_line_finding(tmp_path, "n00")
    assert f.code == "nccl.transport_error" and job_owned(f)
    assert not is_fabric(f)
    assert onsets({n: [f] for n in NODES}, {}, datetime.now(UTC)) == {}
    assert critical([f]) == []  # not the node's fault for a held requeue either


def test_one_echo_in_a_job_log_on_every_node_drains_nothing_and_alerts_the_job(tmp_path: Path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.upgrade()
    slurm = TopologySlurm(NODES)
    slurm.add_job(
        SlurmJob(
            job_id=JOB,
            name="train",
            states=("RUNNING",),
            nodes=tuple(NODES),
            batch_host=NODES[0],
            comment="babysit=max_requeues=3",
            user="mallory",
        )
    )
    cfg = parse_config(
        {
            "policy": {"max_drained_fraction": 1.0, "max_drains_per_hour": 1000},
            "slurm": {"node_refresh_s": 0, "job_scan_s": 0},
        }
    )
    eng = make_engine(cfg, store, slurm=slurm)
    t0 = datetime.now(UTC)
    for step in range(4):  # past the fabric hold (10 s) and window (60 s)
        ReportWriter(store).write(
            [
                Report(
                    node=n,
                    report_id=str(uuid.uuid4()),
                    sent_at=datetime.now(UTC),
                    findings=[job_line_finding(tmp_path, n)],
                    metrics={},
                )
                for n in NODES
            ]
        )
        eng.tick(t0 + timedelta(seconds=40 * step))
    assert eng.sender.flush()

    assert [n.name for n in slurm.nodes() if n.drained_or_draining] == []
    assert [op for op, _ in slurm.calls if op in ("drain", "drain_many")] == []
    assert store.kv_get("fabric_incidents") in (None, [])
    # the job's own line acts on that job alone: one requeue of it, every node kept
    assert [(a.kind, a.rule) for a in store.actions()] == [("requeue", "job_nccl_network")]
    assert [t for op, t in slurm.calls if op == "requeue"] == [str(JOB)]
    conditions = {a["condition"]: a["state"] for a in store.alerts()}
    assert not [c for c in conditions if c.startswith("switch_suspected")]
    assert conditions.get(f"job_log_{JOB}") == "firing", conditions
    [job] = slurm.jobs()
    assert job.restart_count == 1 and job.excluded_nodes == ()
