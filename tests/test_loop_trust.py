"""Trust levels (issue 14.4): findings made from what a job prints belong to the job. A real
Slurm job prints NCCL's watchdog text into its own log; the node's job-log check turns it into
a finding, the agent's report carries it to a real controller: no node is drained, and the
alert names the job."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import httpx

from babysitter.checks.base import CheckContext
from babysitter.checks.nccl.check import NcclLogCheck
from babysitter.config import parse_config
from tests.fixtures.controller import ControllerProcess, controller_config, free_port
from tests.fixtures.slurm import node_state, slurm, wait_for

WATCHDOG = (
    "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600042 milliseconds before timing out."
)


def test_job_printing_nccl_watchdog_text_drains_nothing_and_alert_names_the_job(
    clean_cluster, secrets, tmp_path, receiver, monkeypatch
):
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o777)
    job = int(
        slurm(
            clean_cluster,
            "sbatch",
            "--parsable",
            "-o",
            str(logs / "slurm-%j.out"),
            "--wrap",
            f"echo '{WATCHDOG}'; sleep 300",
        ).stdout.strip()
    )
    log = logs / f"slurm-{job}.out"
    wait_for(lambda: log.exists() and "Watchdog" in log.read_text(), 30, "the job's log line")
    node = slurm(clean_cluster, "squeue", "-h", "-j", str(job), "-o", "%N").stdout.strip()

    cfg = parse_config({"checks": {"nccl": {"job_log_globs": [str(logs / "*.out")]}}})
    # the check asks the node's slurmd which jobs run there (scontrol listpids): this cluster's
    for k in ("SLURM_CONF", "PATH"):
        monkeypatch.setenv(k, clean_cluster.env()[k])
    findings = NcclLogCheck(CheckContext(cfg, node)).run()
    assert [f.code for f in findings] == ["nccl.watchdog_timeout"]
    # the same shared glob on a node the job does not run on: nothing of it
    other = next(n for n in clean_cluster.nodes if n != node)
    assert NcclLogCheck(CheckContext(cfg, other)).run() == []

    ctl = ControllerProcess(
        controller_config(
            secrets,
            f"sqlite:///{tmp_path / 't.db'}",
            port=free_port(),
            alerts={"webhook_url": receiver.url + "/hook"},
            policy={"max_drained_fraction": 1.0},
        ),
        env={"BABYSITTER_SLURM__SLURM_CONF": clean_cluster.slurm_conf},
        log=tmp_path / "ctl.log",
    ).start(timeout=90)
    try:
        r = httpx.post(
            ctl.url + "/api/v1/reports",
            json={
                "node": node,
                "report_id": str(uuid.uuid4()),
                "sent_at": datetime.now(UTC).isoformat(),
                "findings": [f.to_json_dict() for f in findings],
                "metrics": {},
            },
            headers=secrets.headers(node),
            timeout=10,
        )
        assert r.status_code == 202, r.text

        def job_alert() -> list[dict]:
            return [b for b in receiver.bodies("/hook") if b["condition"] == f"job_log_{job}"]

        wait_for(lambda: bool(job_alert()), 30, "a job-level alert")
        [a] = job_alert()
        assert f"job {job}" in a["summary"] and a["nodes"] == [node]  # one alert per job
        assert "not drained" in a["summary"]
        for _ in range(10):  # several more ticks (0.2 s loop): still nothing drained
            assert node_state(clean_cluster, node)[0] in ("alloc", "mix")
            time.sleep(0.2)
        acts = httpx.get(
            ctl.url + "/api/v1/actions",
            headers={"Authorization": f"Bearer {secrets.admin}"},
            timeout=5,
        ).json()
        assert not [x for x in acts if x["kind"] == "drain"]
    finally:
        ctl.stop()
