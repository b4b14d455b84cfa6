"""A babysat training-like job survives a GPU fault: requeued once from its last complete
checkpoint, away from the bad node; a second fault past max_requeues holds it and alerts.
Real Slurm, the real SPANK plugin and job_submit.lua, agents over simulated GPUs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter.devcluster.receiver import Receiver
from babysitter.devcluster.sim import SimCluster
from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.slurm import slurm, wait_for

REPO = Path(__file__).resolve().parents[1]

TRAIN = """
import os, sys, time
sys.path.insert(0, {repo!r})
from babysitter import job
ckpt = os.environ["BABYSIT_CKPT"]
start = job.resume_path()
print("start restart=%s resume_env=%s helper=%s" % (os.environ.get("SLURM_RESTART_COUNT", "0"),
      os.environ.get("BABYSIT_RESUME_FROM", ""), start), flush=True)
first = int(start.rsplit("step", 1)[1]) + 1 if start else 1
for step in range(first, first + 1000):
    d = os.path.join(ckpt, "step%d" % step)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "shard0.bin"), "w") as f:
        f.write("weights")
    if step == 4 and not start:
        print("writing step 4", flush=True)
        time.sleep(3600)  # step 4 is half-written when the fault comes
    job.mark_checkpoint_complete(d)
    job.heartbeat(step)
    print("step %d done" % step, flush=True)
    time.sleep(0.5 if start else 0.1)
"""


@pytest.fixture
def sim(tmp_path: Path, receiver: Receiver, slurm_daemons: str) -> Iterator[SimCluster]:
    s = SimCluster(tmp_path / "sim", n_nodes=4, webhook_url=receiver.url + "/hook")
    s.up()
    try:
        yield s
    finally:
        slurm(s.info, "scancel", "-u", "root", check=False)
        s.down()


def agents_reporting(sim: SimCluster) -> None:
    """Every agent has reported twice: its NVML event set is registered (NVML, like the fake,
    delivers an XID only to event sets that existed when it happened)."""
    first: dict[str, str] = {}

    def twice() -> bool:
        for n in sim.api("/api/v1/nodes"):
            if n.get("last_report_at"):
                first.setdefault(n["name"], n["last_report_at"])
        return len(first) == sim.n_nodes and all(
            n.get("last_report_at") != first[n["name"]] for n in sim.api("/api/v1/nodes")
        )

    wait_for(twice, 90, "every agent reporting")


def test_babysat_job_requeued_from_last_complete_checkpoint(sim, receiver, tmp_path):
    info = sim.info
    agents_reporting(sim)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (tmp_path / "train.py").write_text(TRAIN.format(repo=str(REPO)))
    out = tmp_path / "job.out"
    r = slurm(
        info,
        "sbatch",
        "--parsable",
        f"--babysit=ckpt={ckpt},max_requeues=1",
        "--open-mode=append",
        "-o",
        str(out),
        "--wrap",
        f"exec {sys.executable} {tmp_path / 'train.py'}",
    )
    job = int(r.stdout.strip())
    client = CliSlurmClient(slurm_conf=Path(info.slurm_conf))
    assert client.job(job).admin_comment == f"babysit=ckpt={ckpt},max_requeues=1"
    wait_for(lambda: out.exists() and "writing step 4" in out.read_text(), 60, "step 4 started")
    node = client.job(job).nodes[0]
    other = int(
        slurm(
            info, "sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", "sleep 600"
        ).stdout.strip()
    )
    wait_for(lambda: client.job(other).running, 30, "the other job running")

    sim.inject_xid(node, 1, 79)
    wait_for(lambda: client.job(job).restart_count == 1, 30, "job requeued")
    j = client.job(job)
    assert node in j.excluded_nodes
    resume = (ckpt / ".babysitter" / "resume.json").read_text()
    assert f'"path": "{ckpt / "step3"}"' in resume
    # the restarted job sees the plugin's BABYSIT_RESUME_FROM and continues from step 4
    wait_for(lambda: "restart=1" in out.read_text(), 90, "job restarted")
    text = out.read_text()
    assert f"resume_env={ckpt / 'step3'}" in text
    wait_for(lambda: "step 5 done" in out.read_text(), 30, "training continued")
    # a job that did not opt in is left to Slurm
    o = client.job(other)
    assert o.restart_count == 0 and o.running
    requeues = [a for a in sim.api("/api/v1/actions") if a["kind"] == "requeue"]
    assert [a["job_id"] for a in requeues] == [job]
    jobs = {j["job_id"]: j for j in sim.api("/api/v1/jobs")}
    assert jobs[job]["requeues"] == 1 and jobs[job]["resume_point"] == str(ckpt / "step3")

    # second fault on its new node: past max_requeues=1 -> held, alert
    new_node = client.job(job).nodes[0]
    sim.inject_xid(new_node, 0, 79)
    wait_for(
        lambda: client.job(job).state_reason.startswith("Job") and client.job(job).pending,
        30,
        "job held",
    )
    assert "Held" in client.job(job).state_reason
    wait_for(
        lambda: any(
            str(b.get("condition", "")).startswith("job_requeue_limit")
            for b in receiver.bodies("/hook")
        ),
        20,
        "requeue-limit alert",
    )
