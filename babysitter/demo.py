"""`babysitter demo`: the newcomer's tour, on this machine, in about a minute.

A real Slurm cluster (devcluster), the controller on SQLite, one agent per node over simulated
GPUs, a babysat training-like job that checkpoints, a GPU fault (XID 79), and then: the
finding, the drain, the requeue from the last complete checkpoint, the alert, the recovery.
Everything it starts is stopped at the end."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from babysitter.devcluster.receiver import Receiver
from babysitter.devcluster.sim import SimCluster, sim_validation
from babysitter.slurm.cli import CliSlurmClient

# The directory `babysitter` is imported from (the checkout, or site-packages for a wheel): the
# job script runs under another interpreter and must import the same package.
IMPORT_ROOT = Path(__file__).resolve().parents[1]

TRAIN = """
import os, sys, time
sys.path.insert(0, {repo!r})
from babysitter import job
ckpt = os.environ["BABYSIT_CKPT"]
start = job.resume_path()
print("start restart=%s resume=%s" % (os.environ.get("SLURM_RESTART_COUNT", "0"),
      os.environ.get("BABYSIT_RESUME_FROM", "")), flush=True)
first = int(start.rsplit("step", 1)[1]) + 1 if start else 1
for step in range(first, first + 10000):
    d = os.path.join(ckpt, "step%d" % step)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "model.bin"), "w") as f:
        f.write("weights at step %d" % step)
    time.sleep(1.0)
    job.mark_checkpoint_complete(d)
    job.heartbeat(step)
    print("step %d done" % step, flush=True)
"""


class Tour:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.events: list[tuple[float, str, str]] = []
        self.t0 = time.monotonic()
        self.status = ""

    def log(self, what: str, detail: str = "") -> None:
        self.events.append((time.monotonic() - self.t0, what, detail))

    def render(self) -> Table:
        t = Table(title=f"babysitter demo — {self.status}", expand=True)
        t.add_column("t (s)", justify="right", width=6)
        t.add_column("what happened", style="bold")
        t.add_column("detail")
        for at, what, detail in self.events[-18:]:
            t.add_row(f"{at:5.1f}", what, detail)
        return t


def _wait(live: Live, tour: Tour, cond: Callable[[], bool], timeout: float, what: str) -> None:
    tour.status = what
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live.update(tour.render())
        if cond():
            return
        time.sleep(0.2)
    raise TimeoutError(f"demo step timed out: {what}")


class _Steps:
    """The tour's steps on one simulated cluster, each waiting for what a user would see."""

    def __init__(
        self, live: Live, tour: Tour, sim: SimCluster, receiver: Receiver, base: Path
    ) -> None:
        self.live = live
        self.tour = tour
        self.sim = sim
        self.receiver = receiver
        self.base = base
        self.out = base / "train.out"

    def wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        _wait(self.live, self.tour, cond, timeout, what)

    def cluster_up(self) -> CliSlurmClient:
        tour, sim = self.tour, self.sim
        tour.status = "starting"
        self.live.update(tour.render())
        sim.up()
        assert sim.info is not None
        tour.log(
            "Slurm cluster up",
            f"Slurm {sim.info.slurm_version}, {len(sim.info.nodes)} nodes x 8 simulated H100s",
        )
        tour.log("controller up", f"{sim.url} (SQLite), agents on every node")
        self.wait(
            lambda: sum(n["verdict"] == "healthy" for n in sim.api("/api/v1/nodes")) == 4,
            60,
            "agents reporting",
        )
        tour.log("all nodes healthy", "every GPU, NVLink, PCIe link and ECC counter checked")
        return CliSlurmClient(slurm_conf=Path(sim.info.slurm_conf))

    def start_training(self, slurm: CliSlurmClient) -> tuple[int, str]:
        """A babysat job that checkpoints; (job id, its node) once three checkpoints are done."""
        assert self.sim.info is not None
        ckpt = self.base / "ckpt"
        ckpt.mkdir()
        (self.base / "train.py").write_text(TRAIN.format(repo=str(IMPORT_ROOT)))
        r = subprocess.run(
            [
                "sbatch",
                "--parsable",
                f"--babysit=ckpt={ckpt},max_requeues=2",
                "--open-mode=append",
                "-o",
                str(self.out),
                "--job-name=llm-train",
                "--wrap",
                f"exec {sys.executable} {self.base / 'train.py'}",
            ],
            env=self.sim.info.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        job = int(r.stdout.strip())
        self.tour.log("babysat job submitted", f"sbatch --babysit=ckpt={ckpt} (job {job})")
        self.wait(
            lambda: self.out.exists() and "step 3 done" in self.out.read_text(),
            60,
            "training: writing checkpoints",
        )
        node = slurm.job(job).nodes[0]
        self.tour.log("training", f"job {job} on {node}, checkpoints step1..step3 complete")
        return job, node

    def break_gpu(self, slurm: CliSlurmClient, node: str) -> None:
        """XID 79 on the job's node: the drain and the alert."""
        tour = self.tour
        self.sim.inject_xid(node, 3, 79)
        tour.log("FAULT injected", f"XID 79 (GPU fell off the bus) on {node} gpu3")

        def drained() -> bool:
            n = slurm.node(node)
            return n.drained_or_draining and n.reason.startswith("babysitter:")

        self.wait(drained, 30, "waiting for the drain")
        tour.log("finding -> node drained", slurm.node(node).reason)
        self.wait(lambda: self.receiver.bodies("/alerts") != [], 30, "alert")
        alert = self.receiver.bodies("/alerts")[0]
        tour.log(
            "alert sent",
            escape(
                f"[{alert['severity']}] {alert['condition']} on {alert['node']}: "
                f"what to do: {alert['what_to_do'][:70]}…"
            ),
        )

    def requeue(self, slurm: CliSlurmClient, job: int, node: str) -> None:
        """The job requeued from its last complete checkpoint, restarted on another node."""
        tour, out = self.tour, self.out
        self.wait(lambda: slurm.job(job).restart_count >= 1, 30, "requeue")
        jobs = {j["job_id"]: j for j in self.sim.api("/api/v1/jobs")}
        tour.log("job requeued", f"from {jobs[job]['resume_point']}, {node} excluded")
        self.wait(
            lambda: "restart=1" in out.read_text(),
            90,
            "job waiting to restart elsewhere (Slurm's cred_expire, ~12 s)",
        )
        resumed = next(ln for ln in out.read_text().splitlines() if "restart=1" in ln)
        new_node = slurm.job(job).nodes[0] if slurm.job(job).nodes else "?"
        tour.log("job restarted", f"on {new_node}: {resumed.split(' ', 1)[1]}")

    def heal(self, slurm: CliSlurmClient, node: str) -> None:
        """Reboot, validation job, back in service and the alert resolved, with no human."""
        tour, sim = self.tour, self.sim
        self.wait(lambda: sim.reboots.get(node, 0) >= 1, 120, "self-healing: reboot")
        tour.log(
            "node rebooted by babysitter",
            f"scontrol reboot ASAP {node}: RebootProgram ran, slurmd reported the boot",
        )

        def healed() -> bool:
            rows = sim.api(f"/api/v1/ledger?node={node}&limit=1")
            return bool(rows) and rows[0]["state"] == "passed"

        self.wait(healed, 120, "validation job on the rebooted node")
        row = sim.api(f"/api/v1/ledger?node={node}&limit=1")[0]
        tour.log("validated", f"{node}: {row['outcome']}")
        self.wait(
            lambda: not slurm.node(node).drained_or_draining and not slurm.node(node).reason,
            60,
            "back in service",
        )
        tour.log("node back in service", f"{node}: no human step (babysitter ledger {node})")
        self.wait(
            lambda: any(b["state"] == "resolved" for b in self.receiver.bodies("/alerts")),
            30,
            "alert resolve",
        )
        tour.log("alert resolved", f"{node} healthy again")


def run(base: Path | None = None, keep: bool = False) -> int:
    console = Console()
    base = Path(base or tempfile.mkdtemp(prefix="babysitter-demo-"))
    receiver = Receiver()
    sim = SimCluster(
        base / "sim",
        n_nodes=4,
        webhook_url=receiver.url + "/alerts",
        policy={"resume_after_clean_checks": 2},
        # `scontrol reboot` power-cycles a simulated node: babysitter heals it on its own
        reboot_hook=True,
        validation=sim_validation(base / "sim"),
    )
    tour = Tour(console)
    ok = False
    try:
        with Live(tour.render(), console=console, refresh_per_second=8) as live:
            steps = _Steps(live, tour, sim, receiver, base)
            slurm = steps.cluster_up()
            job, node = steps.start_training(slurm)
            steps.break_gpu(slurm, node)
            steps.requeue(slurm, job, node)
            steps.heal(slurm, node)
            tour.status = "done"
            live.update(tour.render())
            ok = True
    finally:
        sim.down()
        receiver.close()
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    took = time.monotonic() - tour.t0
    if ok:
        console.print(
            f"[bold green]demo ok[/]: fault -> drain -> requeue from the last "
            f"complete checkpoint -> alert -> recovery, in {took:.0f} s; "
            "everything it started is stopped."
        )
        return 0
    return 1
