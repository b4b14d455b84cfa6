"""Fault -> drain latency on a real devcluster with agents on simulated GPUs/IB, for XID 79,
GPU lost, DBE and an IB port going down (>= 20 injections each), beside the raw Slurm drain
latency measured in the same run; and fault -> babysat job requeued (PENDING, restart +1).
Run: python -m bench.fault_drain"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from babysitter.devcluster import simib
from babysitter.devcluster.sim import SimCluster
from babysitter.slurm.cli import CliSlurmClient
from bench.common import figure, summary, write_result

INJECTIONS = 20
JOB_INJECTIONS = 3


def wait(cond, timeout: float, poll: float = 0.02) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(poll)
    raise TimeoutError


def main() -> int:
    t_start = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="bench-fault-"))
    sim = SimCluster(
        base,
        n_nodes=4,
        ib_ports=8,
        check_interval_s=0.5,
        agent_interval_s=0.5,
        policy={
            "max_drained_fraction": 1.0,
            "max_drains_per_hour": 100000,
            "resume_after_clean_checks": 1,
        },
    )
    results: dict[str, list[float]] = {}
    try:
        sim.up()
        assert sim.info is not None
        slurm = CliSlurmClient(slurm_conf=Path(sim.info.slurm_conf))
        wait(lambda: sum(n["verdict"] == "healthy" for n in sim.api("/api/v1/nodes")) == 4, 60)

        def drained(node: str) -> bool:
            return slurm.node(node).drained_or_draining

        faults = {
            "xid79": lambda n: sim.inject_xid(n, 3, 79),
            "gpu_lost": lambda n: sim.nodes[n].gpus.lose(5),
            "dbe": lambda n: sim.nodes[n].gpus.set(2, dbe_volatile=1),
            "ib_port_down": lambda n: simib.set_port(
                sim.nodes[n].config.parent / "sysfs", "mlx5_3", 1, active=False
            ),
        }
        nodes = sim.info.nodes
        k = 0
        for fault, inject in faults.items():
            lat = results.setdefault(fault, [])
            for _ in range(INJECTIONS):
                node = nodes[k % len(nodes)]
                k += 1
                t0 = time.monotonic()
                inject(node)
                wait(lambda n=node: drained(n), 30)
                lat.append(time.monotonic() - t0)
                sim.reboot(node)
                wait(lambda n=node: not drained(n), 60, poll=0.1)
            print(f"{fault}: {summary(lat)}", flush=True)
        # baseline in the same run: Slurm's own drain, observed the same way
        raw = results.setdefault("raw_scontrol_drain", [])
        env = sim.info.env()
        for i in range(INJECTIONS):
            node = nodes[i % len(nodes)]
            t0 = time.monotonic()
            subprocess.run(
                ["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=bench"],
                env=env,
                check=True,
                timeout=30,
            )
            wait(lambda n=node: drained(n), 30)
            raw.append(time.monotonic() - t0)
            subprocess.run(
                ["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                env=env,
                check=True,
                timeout=30,
            )
            wait(lambda n=node: not drained(n), 30, poll=0.1)
        # fault -> babysat job requeued
        req = results.setdefault("job_requeue", [])
        ckpt = base / "ckpt"
        ckpt.mkdir()
        for _ in range(JOB_INJECTIONS):
            jid = int(
                subprocess.run(
                    [
                        "sbatch",
                        "--parsable",
                        f"--babysit=ckpt={ckpt},max_requeues=100",
                        "-o",
                        "/dev/null",
                        "--wrap",
                        "sleep 600",
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=30,
                ).stdout.strip()
            )
            wait(lambda j=jid: slurm.job(j).running, 60, poll=0.1)
            node = slurm.job(jid).nodes[0]
            t0 = time.monotonic()
            sim.inject_xid(node, 0, 79)
            wait(
                lambda j=jid: slurm.job(j).restart_count >= 1 and "PENDING" in slurm.job(j).states,
                60,
            )
            req.append(time.monotonic() - t0)
            subprocess.run(["scancel", str(jid)], env=env, timeout=30)
            sim.reboot(node)
            wait(lambda n=node: not drained(n), 60, poll=0.1)
        print(f"job_requeue: {summary(req)}", flush=True)
    finally:
        sim.down()
        shutil.rmtree(base, ignore_errors=True)
    raw_p50 = summary(results["raw_scontrol_drain"])["p50"]
    figs = []
    for fault in ("xid79", "gpu_lost", "dbe", "ib_port_down"):
        s = summary(results[fault])
        figs.append(
            figure(
                f"fault -> drain p50, {fault}",
                s["p50"],
                "s",
                baseline="raw scontrol drain p50",
                baseline_value=raw_p50,
                goal="p50 <= 1 s",
                met=s["p50"] <= 1.0,
                **s,
            )
        )
        figs.append(
            figure(
                f"fault -> drain p99, {fault}",
                s["p99"],
                "s",
                goal="p99 <= 3 s",
                met=s["p99"] <= 3.0,
                n=s["n"],
            )
        )
    s = summary(results["job_requeue"])
    figs.append(
        figure(
            "fault -> babysat job requeued p50",
            s["p50"],
            "s",
            baseline="raw scontrol drain p50",
            baseline_value=raw_p50,
            **s,
        )
    )
    write_result(
        "fault_drain",
        figs,
        {
            "samples": results,
            "note": "polled checks (DBE, GPU lost, IB) ran every "
            "0.5 s in this run; XID comes from NVML events",
        },
        duration_s=round(time.monotonic() - t_start, 1),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
