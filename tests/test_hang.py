"""Hang detection: a babysat job whose progress signal stops for hang_timeout is reported."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.store import Store
from babysitter.controller.loop.jobs import hang
from babysitter.controller.loop.remediation import make_engine
from babysitter.devcluster.receiver import Receiver
from babysitter.report import Report
from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.slurm import slurm, wait_for


def test_heartbeat_age(tmp_path):
    hb = tmp_path / ".babysitter" / "heartbeat-7.json"
    hb.parent.mkdir()
    hb.write_text(json.dumps({"step": 3, "time": 1000.0}))
    assert hang.heartbeat_age(str(tmp_path), 7, 1600.0) == 600.0
    assert hang.heartbeat_age(str(tmp_path / "none"), 7, 1600.0) is None


def _stalled_job(cluster, tmp_path: Path) -> tuple[int, CliSlurmClient]:
    ckpt = tmp_path / "ckpt"
    (ckpt / ".babysitter").mkdir(parents=True)
    job = int(
        slurm(
            cluster,
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            f"--comment=babysit=ckpt={ckpt},hang_timeout=60",
            "--wrap",
            "sleep 600",
        ).stdout.strip()
    )
    cl = CliSlurmClient(slurm_conf=Path(cluster.slurm_conf))
    wait_for(lambda: cl.job(job).running, 30, "running")
    (ckpt / ".babysitter" / f"heartbeat-{job}.json").write_text(
        json.dumps({"step": 5, "time": datetime.now(UTC).timestamp() - 3600})
    )
    return job, cl


def _tick(cluster, tmp_path, receiver, job, cl, util: int, **policy):
    store = Store(f"sqlite:///{tmp_path / f'h{util}.db'}")
    store.upgrade()
    node = cl.job(job).nodes[0]
    ReportWriter(store).write(
        [
            Report(
                node=node,
                report_id=str(uuid.uuid4()),
                sent_at=datetime.now(UTC),
                findings=[],
                metrics={"gpu_util": {str(i): util for i in range(8)}},
            )
        ]
    )
    cfg = parse_config({"alerts": {"webhook_url": receiver.url + "/hook"}, "policy": policy})
    engine = make_engine(cfg, store, slurm=cl)
    engine.tick()  # the scan: alert, and a requeue action when configured
    engine.tick()  # the pending requeue runs
    engine.sender.flush()
    engine.close()
    store.close()
    return [b for b in receiver.bodies("/hook") if b["condition"] == f"job_hung_{job}"]


def test_stalled_job_with_busy_gpus_is_not_a_hang(clean_cluster, tmp_path, receiver: Receiver):
    job, cl = _stalled_job(clean_cluster, tmp_path)
    assert _tick(clean_cluster, tmp_path, receiver, job, cl, util=95) == []


def test_stalled_job_with_idle_gpus_alerts_and_requeues_when_configured(
    clean_cluster, tmp_path, receiver: Receiver
):
    job, cl = _stalled_job(clean_cluster, tmp_path)
    [alert] = _tick(clean_cluster, tmp_path, receiver, job, cl, util=0, requeue_hung_jobs=True)
    assert "made no progress" in alert["summary"] and "requeued" in alert["action_taken"]
    wait_for(lambda: cl.job(job).restart_count == 1, 30, "requeued")


def test_heartbeat_that_is_a_fifo_or_a_link_never_blocks(tmp_path):
    """The job owns its checkpoint directory: a FIFO where the heartbeat should be would block
    a plain read forever; a link could point anywhere. Both are ignored."""
    import os

    d = tmp_path / ".babysitter"
    d.mkdir()
    os.mkfifo(d / "heartbeat-7.json")
    (tmp_path / "step1").write_text("x")
    age = hang.heartbeat_age(str(tmp_path), 7, 1e10)  # falls back to the newest file
    assert age is not None and age > 0
    secret = tmp_path / "elsewhere.json"
    secret.write_text('{"time": 1.0}')
    (d / "heartbeat-8.json").symlink_to(secret)
    assert hang.heartbeat_age(str(tmp_path), 8, 1e10) != 1e10 - 1.0
