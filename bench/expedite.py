"""The queue wait Slurm 25.11's expedited requeue saves a babysat job requeued off a faulty node,
on a real 25.11 devcluster (built from source) with `SlurmctldParameters=
enable_expedited_requeue`, the devcluster's cred_expire=10 (so a plain requeue's delay is 11 s;
Slurm's default is 121 s).

Each repetition: a 2-node job (whole nodes: --exclusive) on two of three nodes; babysitter
drains one of them for a fault and requeues the job through its client (`requeue(job,
exclude=[node])`), which on 25.11 takes Slurm's expedite for a job submitted with
`--requeue=expedite` and the plain requeue otherwise.
Measured: seconds from the requeue call to the job RUNNING again. Two scenarios:
- competitor: a 2-node job (`sleep COMPETITOR_S`) is pending behind it and wants the same nodes;
- alone: nothing else waits (only the requeue delay differs).
The arms alternate (expedite, plain, expedite, ...) on the same cluster, same nodes, same
commands; only `--requeue=expedite` vs `--requeue` at submission differs.
Run: python -m bench.expedite [repetitions]"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from babysitter.devcluster import DevCluster
from babysitter.devcluster.cluster import ClusterInfo
from babysitter.slurm.cli import CliSlurmClient
from bench.common import figure, summary, wait_until, write_result

REPETITIONS = 3
COMPETITOR_S = 20
FAULT = "xid.nvml: XID 79 on GPU 3 (reboot: node fault)"
ARMS = {"expedite": "--requeue=expedite", "plain": "--requeue"}


def _sbatch(cl: CliSlurmClient, *args: str) -> int:
    return cl.sc.sbatch(["-o", "/dev/null", *args])


def _reset(cl: CliSlurmClient, info: ClusterInfo) -> None:
    """No jobs, every node idle with no reason."""

    def active() -> list[int]:  # ended jobs stay listed for MinJobAge
        live = ("RUNNING", "PENDING", "COMPLETING")
        return [j.job_id for j in cl.jobs() if set(j.states) & set(live)]

    for j in active():
        cl.cancel_job(j)
    wait_until(lambda: not active(), 60, what="no jobs")
    for n in cl.nodes():
        if n.reason or n.down or n.drained_or_draining:
            cl.sc.resume(n.name)
    wait_until(
        lambda: all(n.state == "IDLE" and not n.flags for n in cl.nodes()),
        60,
        what="nodes idle",
    )


def one(cl: CliSlurmClient, info: ClusterInfo, arm: str, competitor: bool) -> dict[str, Any]:
    _reset(cl, info)
    job = _sbatch(cl, "-N2", "--exclusive", ARMS[arm], "--wrap", "sleep 600")
    wait_until(lambda: cl.job(job).running, 30, what="job running")
    bad = cl.job(job).nodes[1]
    other = None
    if competitor:
        other = _sbatch(cl, "-N2", "--exclusive", "--wrap", f"sleep {COMPETITOR_S}")
        wait_until(lambda: cl.job(other).state == "PENDING", 15, what="competitor pending")
    cl.drain(bad, FAULT)
    t0 = time.monotonic()
    cl.requeue(job, exclude=[bad])
    wait_s = wait_until(lambda: cl.job(job).running, 300, poll=0.05, what="job running again")
    total = time.monotonic() - t0
    first = None
    if other is not None:
        first = "competitor" if cl.job(other).state != "PENDING" else "job"
    return {
        "arm": arm,
        "competitor": competitor,
        "requeue_to_running_s": total,
        "polled_s": wait_s,
        "node_down": cl.node(bad).down,
        "ran_first": first,
    }


def main(argv: list[str]) -> int:
    reps = int(argv[0]) if argv else REPETITIONS
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bs-expedite-") as tmp:
        cluster = DevCluster(
            Path(tmp) / "c",
            nodes=3,
            slurm="25.11",
            restd=False,
            extra_conf=["SlurmctldParameters=enable_expedited_requeue"],
        )
        info = cluster.up()
        try:
            cl = CliSlurmClient(slurm_conf=Path(info.slurm_conf), bin_dir=Path(info.bin or ""))
            for competitor in (True, False):
                for i in range(reps):
                    for arm in ARMS:
                        s = one(cl, info, arm, competitor)
                        samples.append(s)
                        print(
                            f"{'competitor' if competitor else 'alone':10} rep {i + 1} {arm:8} "
                            f"requeue -> running {s['requeue_to_running_s']:6.2f} s "
                            f"(node DOWN: {s['node_down']}, first: {s['ran_first']})",
                            flush=True,
                        )
        finally:
            cluster.down()
    figs = []
    for competitor in (True, False):
        scen = "with a competing pending job" if competitor else "alone"
        by = {
            arm: [
                s["requeue_to_running_s"]
                for s in samples
                if s["arm"] == arm and s["competitor"] == competitor
            ]
            for arm in ARMS
        }
        exp, plain = statistics.median(by["expedite"]), statistics.median(by["plain"])
        print(
            f"{scen}: median requeue -> running: expedite {exp:.2f} s, plain {plain:.2f} s; "
            f"saved {plain - exp:.2f} s (plain/expedite {plain / exp:.1f}x), n={reps} each"
        )
        figs.append(
            figure(
                f"requeue -> running, expedite, {scen}, p50",
                exp,
                "s",
                baseline=f"plain requeue, {scen}",
                baseline_value=plain,
                saved_s=plain - exp,
                expedite=summary(by["expedite"]),
                plain=summary(by["plain"]),
            )
        )
    write_result(
        "expedite",
        figs,
        {"samples": samples},
        settings={
            "slurm": "25.11.7 (source), 3 nodes, cred_expire=10 (requeue delay 11 s)",
            "repetitions": reps,
            "competitor_s": COMPETITOR_S,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
