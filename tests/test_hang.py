"""Hang detection: a babysat job whose progress signal stops for hang_timeout is reported."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from babysitter.config import Config
from babysitter.controller import jobs
from babysitter.controller.remediation import make_engine
from babysitter.controller.store import Store
from babysitter.devcluster.receiver import Receiver
from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.slurm import slurm, wait_for


def test_heartbeat_age(tmp_path):
    hb = tmp_path / ".babysitter" / "heartbeat-7.json"
    hb.parent.mkdir()
    hb.write_text(json.dumps({"step": 3, "time": 1000.0}))
    assert jobs.heartbeat_age(str(tmp_path), 7, 1600.0) == 600.0
    assert jobs.heartbeat_age(str(tmp_path / "none"), 7, 1600.0) is None


def test_stalled_babysat_job_is_reported(clean_cluster, tmp_path, receiver: Receiver):
    ckpt = tmp_path / "ckpt"
    (ckpt / ".babysitter").mkdir(parents=True)
    job = int(
        slurm(
            clean_cluster,
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            f"--comment=babysit=ckpt={ckpt},hang_timeout=60",
            "--wrap",
            "sleep 600",
        ).stdout.strip()
    )
    cl = CliSlurmClient(slurm_conf=Path(clean_cluster.slurm_conf))
    wait_for(lambda: cl.job(job).running, 30, "running")
    (ckpt / ".babysitter" / f"heartbeat-{job}.json").write_text(
        json.dumps({"step": 5, "time": datetime.now(UTC).timestamp() - 3600})
    )
    store = Store(f"sqlite:///{tmp_path / 'h.db'}")
    store.upgrade()
    cfg = Config.model_validate({"alerts": {"webhook_url": receiver.url + "/hook"}})
    engine = make_engine(cfg, store, slurm=cl)
    jobs._last_scan.clear()
    engine.tick()
    [alert] = [b for b in receiver.bodies("/hook") if b["condition"] == f"job_hung_{job}"]
    assert "made no progress" in alert["summary"]
    store.close()
