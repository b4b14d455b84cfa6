"""babysitter and LBNL NHC side by side, in one run, on one devcluster.

NHC 1.4.3 (the vendored source in shared/vendor, checksum verified, never copied into the
repository) runs as Slurm's `HealthCheckProgram` on some nodes; babysitter (controller + agents at
DEFAULT settings, only the blast-radius guard opened for repeated drains) on the others. Both see
the same fake GPUs (the fake libnvidia-ml) and the same injected faults. NHC reads GPU health
through `check_nvsmi_healthmon` with a small C stand-in for nvidia-smi (bench/data/
nhc_gpu_health.c) over the same fake NVML, and drains through its own helper with `NHC:` reasons.

Reported: fault -> drain p50/p99 per fault kind for babysitter and for NHC at HealthCheckInterval
60 s and 300 s; CPU and peak RSS of one NHC run and of one `babysitter check` (both through
/usr/bin/time, children included), and the live agent's CPU and RSS over the NHC@60 phase, as
ratios. NHC has no XID check: XID 79 is reported for babysitter only.
Run: python -m bench.nhc [rounds at 60 s [rounds at 300 s]]"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.devcluster.fakenvml import FakeGpus, build
from babysitter.devcluster.source import source_dirs
from bench.agent_cost import child_cost, cpu_s, rss_mb
from bench.common import REPO, figure, summary, wait_until, write_result
from bench.fault_drain import NO_LADDER, POLICY, DefaultsCluster
from bench.wheel import WHEEL_CACHE, installed_wheel

NHC_TARBALL = "nhc-1.4.3-9c4a38c.tar.gz"
# node1..node6; the last stays healthy: its agent is the one measured. Five take turns: a node
# resumes (after its simulated reboot) while the others take their samples.
BABYSITTER_NODES = 6
NHC_NODES = 8  # node5..node12: two per GPU fault kind per round
ROUNDS = {60: 4, 300: 2}
COST_RUNS = 7
FAST_TIER_S = 1.0

GPU_FAULTS: dict[str, Callable[[FakeGpus], object]] = {
    "gpu_lost": lambda g: g.lose(5),
    "dbe_polled": lambda g: g.set(2, dbe_volatile=1),
    "row_remap_failure": lambda g: g.set(6, remap_failure=1),
    "nvlink_down": lambda g: g.set(1, nvlink_down="3"),
}
BABYSITTER_ONLY = ("xid79",)  # NHC has no check that reads XIDs

NHC_CONF = """\
# What a GPU site's nhc.conf typically holds: the root file system writable, some free memory,
# and the GPU health monitor.
* || check_fs_mount_rw -f /
* || check_hw_physmem_free 1MB
* || check_nvsmi_healthmon
"""


def nhc_source(dest: Path) -> Path:
    """Unpack the vendored NHC after checking its sha256 against SHA256SUMS."""
    vendor = next((d for d in source_dirs() if (d / NHC_TARBALL).is_file()), None)
    if vendor is None:
        raise RuntimeError(f"{NHC_TARBALL} not found in {source_dirs()} (shared/vendor)")
    tarball = vendor / NHC_TARBALL
    want = next(
        line.split()[0]
        for line in (vendor / "SHA256SUMS").read_text().splitlines()
        if line.strip().endswith(NHC_TARBALL)
    )
    got = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if got != want:
        raise RuntimeError(f"{tarball}: sha256 {got}, SHA256SUMS says {want}")
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    [src] = [p for p in dest.iterdir() if p.is_dir()]
    for helper in ("node-mark-offline", "node-mark-online"):
        (src / "helpers" / helper).chmod(0o755)
    (src / "nhc").chmod(0o755)
    return src


def build_gpu_health(out: Path) -> Path:
    exe = out / "nhc_gpu_health"
    src = REPO / "bench" / "data" / "nhc_gpu_health.c"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src), "-ldl"], check=True)
    return exe


@dataclass
class SideBySide(DefaultsCluster):
    """The defaults cluster, with no babysitter agent on the NHC nodes (the controller never
    hears of them, so it neither drains nor resumes them)."""

    nhc_nodes: set[str] = field(default_factory=set)

    def start_agent(self, node: str, lib: Path | None = None) -> None:
        if node not in self.nhc_nodes:
            super().start_agent(node, lib)


def wrapper_script(base: Path, src: Path, helper: Path, lib: Path) -> str:
    """Slurm's HealthCheckProgram: NHC on the NHC nodes, nothing on babysitter's (their agents
    watch them). slurmd gives the program SLURMD_NODENAME; every devcluster slurmd shares one
    host name, so NHC is told which node it is."""
    return f"""#!/bin/bash
node="$SLURMD_NODENAME"
grep -qx "$node" {base}/nhc/nodes 2>/dev/null || exit 0
export FAKE_NVML_STATE={base}/nodes/"$node"/nvml-state LD_LIBRARY_PATH={lib}
export SLURM_CONF="$(cat {base}/nhc/slurm_conf)" PATH="$(cat {base}/nhc/path)"
exec {src}/nhc -c {base}/nhc/nhc.conf -D {src} -t 30 HOSTNAME="$node" NHC_RM=slurm \\
    HELPERDIR={src}/helpers LOGFILE={base}/nhc/nhc.log RESULTFILE={base}/nhc/"$node".status \\
    NVIDIA_SMI_HEALTHMON={helper}
"""


def run_interval(
    base: Path, interval: int, rounds: int, src: Path, helper: Path
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, float]]:
    """One devcluster with NHC at `interval`: NHC samples, babysitter samples taken meanwhile,
    and the measured agent's cost over the phase."""
    base.mkdir(parents=True)
    (base / "nhc").mkdir()
    (base / "nhc" / "nhc.conf").write_text(NHC_CONF)
    lib = build()
    hcp = base / "nhc" / "health_check.sh"
    hcp.write_text(wrapper_script(base, src, helper, lib))
    hcp.chmod(0o755)
    names = [f"node{i}" for i in range(1, BABYSITTER_NODES + NHC_NODES + 1)]
    ours, theirs = names[:BABYSITTER_NODES], names[BABYSITTER_NODES:]
    (base / "nhc" / "nodes").write_text("\n".join(theirs) + "\n")
    sim = SideBySide(
        base,
        n_nodes=len(names),
        policy=POLICY,
        extra_config=NO_LADDER,
        nhc_nodes=set(theirs),
        extra_slurm_conf=[
            f"HealthCheckProgram={hcp}",
            f"HealthCheckInterval={interval}",
            "HealthCheckNodeState=ANY",
        ],
    )
    nhc: dict[str, list[float]] = {k: [] for k in GPU_FAULTS}
    ours_lat: dict[str, list[float]] = {k: [] for k in (*BABYSITTER_ONLY, *GPU_FAULTS)}
    try:
        sim.up()
        assert sim.info is not None
        env = sim.info.env()
        (base / "nhc" / "slurm_conf").write_text(sim.info.slurm_conf)
        path = (sim.info.bin + ":" if sim.info.bin else "") + os.environ.get("PATH", "")
        (base / "nhc" / "path").write_text(path)

        def states() -> dict[str, tuple[str, str]]:
            out = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N|%T|%E"],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            rows = (line.split("|", 2) for line in out.splitlines() if line.count("|") >= 2)
            return {n: (t, r) for n, t, r in rows}

        def drained_by(node: str, prefix: str) -> bool:
            state, reason = states().get(node, ("", ""))
            return "drain" in state and reason.startswith(prefix)

        def resume(node: str) -> None:
            subprocess.run(
                ["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                env=env,
                timeout=30,
                capture_output=True,
            )

        wait_until(
            lambda: all(st[1] in ("", "none") for st in states().values()),
            120,
            what="no node drained",
        )

        def healthy() -> set[str]:
            return {n["name"] for n in sim.api("/api/v1/nodes") if n["verdict"] == "healthy"}

        wait_until(lambda: set(ours) <= healthy(), 120, what="babysitter's nodes healthy")
        measured = sim.nodes[ours[-1]].proc
        assert measured is not None
        cpu0, t_phase = cpu_s(measured.pid), time.monotonic()
        rng = random.Random(interval)
        kinds = itertools.cycle((*BABYSITTER_ONLY, *GPU_FAULTS))
        injectable = itertools.cycle(ours[:-1])
        for _ in range(rounds):
            # a fault does not wait for NHC's clock: each round starts at a random phase of the
            # interval (babysitter keeps taking samples meanwhile)
            start_at = time.monotonic() + rng.uniform(0, interval)
            while time.monotonic() < start_at:
                node, kind = next(injectable), next(kinds)
                ours_lat[kind].append(babysitter_sample(sim, node, kind, drained_by, rng))
            # NHC: every NHC node gets one fault at the same moment, two nodes per kind
            pending = dict(zip(theirs, itertools.cycle(GPU_FAULTS), strict=False))
            watcher = NhcWatcher(states, pending, 2 * interval + 60)
            for node, kind in pending.items():
                GPU_FAULTS[kind](sim.nodes[node].gpus)
            watcher.start()
            while watcher.is_alive():
                # babysitter's samples while NHC waits for its next run
                node, kind = next(injectable), next(kinds)
                ours_lat[kind].append(babysitter_sample(sim, node, kind, drained_by, rng))
            watcher.join()
            if watcher.pending:
                raise TimeoutError(f"NHC never drained {sorted(watcher.pending)}")
            for node, latency in watcher.drained:
                nhc[pending[node]].append(latency)
            for node in theirs:
                sim.nodes[node].gpus.reset(8)
                resume(node)
            wait_until(
                lambda: not any(drained_by(n, "NHC:") for n in theirs),
                120,
                what="NHC nodes resumed",
            )
            print(f"NHC@{interval}: { ({k: len(v) for k, v in nhc.items()}) }", flush=True)
            print(f"babysitter: { ({k: [round(x, 2) for x in v] for k, v in ours_lat.items()}) }")
        phase_s = time.monotonic() - t_phase
        agent = {
            "cpu_percent": 100 * (cpu_s(measured.pid) - cpu0) / phase_s,
            "rss_mb": rss_mb(measured.pid)[0],
            "seconds": phase_s,
        }
    finally:
        sim.down()
    return nhc, ours_lat, agent


class NhcWatcher(threading.Thread):
    """Polls Slurm every 0.5 s from the moment of injection until every faulty NHC node is
    drained with an `NHC:` reason (or the deadline passes): the NHC latencies do not depend on
    what the main thread does meanwhile."""

    def __init__(
        self,
        states: Callable[[], dict[str, tuple[str, str]]],
        pending: dict[str, str],
        timeout_s: float,
    ) -> None:
        super().__init__(daemon=True)
        self.states = states
        self.pending = set(pending)
        self.drained: list[tuple[str, float]] = []
        self.timeout_s = timeout_s
        self.t0 = time.monotonic()

    def run(self) -> None:
        while self.pending and time.monotonic() - self.t0 < self.timeout_s:
            snapshot = self.states()
            for node in list(self.pending):
                state, reason = snapshot.get(node, ("", ""))
                if "drain" in state and reason.startswith("NHC:"):
                    self.drained.append((node, time.monotonic() - self.t0))
                    self.pending.discard(node)
            time.sleep(0.5)


def babysitter_sample(
    sim: SideBySide,
    node: str,
    kind: str,
    drained_by: Callable[[str, str], bool],
    rng: random.Random,
) -> float:
    """Inject one fault on a babysitter node at a random phase of its 1 s grid, time the
    drain, then reboot the node (simulated); babysitter resumes it while the other nodes take
    their turns."""
    # back from its last reboot
    wait_until(lambda: not drained_by(node, "babysitter:"), 120, what=f"{node} resumed")
    time.sleep(rng.uniform(0, FAST_TIER_S))
    t0 = time.monotonic()
    if kind == "xid79":
        sim.inject_xid(node, 3, 79)
    else:
        GPU_FAULTS[kind](sim.nodes[node].gpus)
    wait_until(lambda: drained_by(node, "babysitter:"), 60, poll=0.05, what=f"{node} drained")
    latency = time.monotonic() - t0
    sim.reboot(node)
    return latency


def one_shot_costs(base: Path, src: Path, helper: Path) -> dict[str, dict[str, float]]:
    """CPU and peak RSS of one NHC run and of one `babysitter check`, on the same 8 healthy fake
    GPUs, measured the same way (/usr/bin/time, children included), median of COST_RUNS."""
    d = base / "cost"
    (d / "wheel").mkdir(parents=True)
    gpus = FakeGpus(d / "nvml-state", count=8)
    env = dict(os.environ, **gpus.env(build()))
    (d / "kmsg").touch()
    (d / "nhc.conf").write_text(NHC_CONF)
    nhc_cmd = [
        str(src / "nhc"),
        "-c",
        str(d / "nhc.conf"),
        "-D",  # NHC's CONFDIR: it loads $CONFDIR/scripts/*.nhc
        str(src),
        "-t",
        "30",
        "HOSTNAME=cost",
        "MARK_OFFLINE=0",
        f"HELPERDIR={src / 'helpers'}",
        f"LOGFILE={d / 'nhc.log'}",
        f"RESULTFILE={d / 'nhc.status'}",
        f"NVIDIA_SMI_HEALTHMON={helper}",
    ]
    check_env = dict(
        env,
        BABYSITTER_AGENT__KMSG_PATH=str(d / "kmsg"),
        BABYSITTER_CHECKS__HOST__CHECK_SLURMD="false",
        BABYSITTER_CHECKS__HOST__MIN_FREE_GB="0",
    )
    check_env.pop("BABYSITTER_CONFIG", None)
    # `babysitter check` as a site runs it: the console script of the installed wheel (compiled
    # bytecode, no editable finder), in a venv of the bench's own
    venv = installed_wheel(d / "wheel", cache=WHEEL_CACHE)
    check_cmd = [str(venv / "bin" / "babysitter"), "check"]
    # NHC exits 0 when it finds no scripts to load: prove it runs its checks on a lost GPU
    gpus.lose(5)
    for name, cmd, e in (
        ("nhc", nhc_cmd, env),
        ("babysitter_check", check_cmd, check_env),
    ):
        if child_cost(cmd, e)[2] == 0:
            raise RuntimeError(f"{name} passed a node with a lost GPU: it did not run its checks")
    gpus.reset(8)
    out: dict[str, dict[str, float]] = {}
    for name, cmd, e in (
        ("nhc", nhc_cmd, env),
        ("babysitter_check", check_cmd, check_env),
    ):
        runs = [child_cost(cmd, e) for _ in range(COST_RUNS)]
        bad = [rc for _, _, rc in runs if rc != 0]
        if bad:
            raise RuntimeError(f"{name} failed on healthy GPUs: exit codes {bad}")
        out[name] = {
            "cpu_s": summary([c for c, _, _ in runs])["p50"],
            "peak_rss_mb": summary([m for _, m, _ in runs])["p50"],
        }
    return out


def main() -> int:
    rounds = dict(ROUNDS)
    for i, interval in enumerate(ROUNDS):
        if len(sys.argv) > i + 1:
            rounds[interval] = int(sys.argv[i + 1])
    t_start = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="bench-nhc-"))
    try:
        src = nhc_source(base / "src")
        helper = build_gpu_health(base)
        costs = one_shot_costs(base, src, helper)
        print(f"one-shot costs: {costs}", flush=True)
        nhc: dict[int, dict[str, list[float]]] = {}
        ours: dict[str, list[float]] = {}
        agent: dict[str, float] = {}
        for interval, n in rounds.items():
            if n <= 0:
                continue
            got, mine, cost = run_interval(base / f"hc{interval}", interval, n, src, helper)
            nhc[interval] = got
            for k, v in mine.items():
                ours.setdefault(k, []).extend(v)
            if interval == 60:
                agent = cost
    finally:
        if not os.environ.get("BENCH_KEEP"):  # BENCH_KEEP=1 keeps the logs for a post-mortem
            shutil.rmtree(base, ignore_errors=True)
    figs = figures(nhc, ours, costs, agent)
    write_result(
        "nhc",
        figs,
        {
            "samples_babysitter": ours,
            "samples_nhc": {str(k): v for k, v in nhc.items()},
            "one_shot": costs,
            "agent": agent,
            "note": (
                f"{BABYSITTER_NODES} babysitter nodes at defaults (one kept healthy: its agent "
                f"is measured), {NHC_NODES} NHC nodes (two per fault kind per round), NHC "
                "1.4.3 as HealthCheckProgram with HealthCheckNodeState=ANY; nhc.conf: "
                "check_fs_mount_rw, check_hw_physmem_free, check_nvsmi_healthmon. "
                "babysitter faults are injected at a random phase of its 1 s grid, NHC's at "
                "whatever phase of its interval the round starts."
            ),
        },
        settings={
            "babysitter": "defaults (agent fast tier 1 s, controller loop 1 s); guard opened: "
            + repr(POLICY)
            + "; remediation ladder off (the bench reboots the node itself)",
            "nhc": "1.4.3, HealthCheckProgram, HealthCheckNodeState=ANY, -t 30",
            "rounds": {str(k): v for k, v in rounds.items()},
            "nodes": {"babysitter": BABYSITTER_NODES, "nhc": NHC_NODES},
        },
        duration_s=round(time.monotonic() - t_start, 1),
    )
    write_section(nhc, ours, costs, agent)
    return 0


def figures(
    nhc: dict[int, dict[str, list[float]]],
    ours: dict[str, list[float]],
    costs: dict[str, dict[str, float]],
    agent: dict[str, float],
) -> list[dict[str, Any]]:
    figs: list[dict[str, Any]] = []
    for kind, lat in ours.items():
        if not lat:
            continue
        s = summary(lat)
        extra = {f"nhc_{i}_p50": summary(v[kind])["p50"] for i, v in nhc.items() if v.get(kind)}
        figs.append(
            figure(
                f"fault -> drain p50, babysitter at defaults, {kind}",
                s["p50"],
                "s",
                baseline="NHC at HealthCheckInterval=60, p50" if kind in GPU_FAULTS else None,
                baseline_value=extra.get("nhc_60_p50"),
                goal="p50 <= 1 s",
                met=s["p50"] <= 1.0,
                **extra,
                **s,
            )
        )
    nhc_run, check = costs["nhc"], costs["babysitter_check"]
    figs.append(
        figure(
            "one babysitter check: CPU",
            check["cpu_s"],
            "s",
            baseline="one NHC run (same GPUs, same method)",
            baseline_value=nhc_run["cpu_s"],
            goal="<= 0.06 s",
            met=check["cpu_s"] <= 0.06,
        )
    )
    figs.append(
        figure(
            "one babysitter check: peak RSS",
            check["peak_rss_mb"],
            "MB",
            baseline="one NHC run (same GPUs, same method)",
            baseline_value=nhc_run["peak_rss_mb"],
            goal="<= 16 MB",
            met=check["peak_rss_mb"] <= 16,
        )
    )
    if agent:
        per_min = agent["cpu_percent"] / 100 * 60
        figs.append(
            figure(
                "live agent CPU per minute (8 GPUs, defaults)",
                per_min,
                "s",
                baseline="NHC at HealthCheckInterval=60: one run per minute",
                baseline_value=nhc_run["cpu_s"],
                goal="<= 0.3 % of a core",
                met=agent["cpu_percent"] <= 0.3,
                cpu_percent=agent["cpu_percent"],
                rss_mb=agent["rss_mb"],
            )
        )
    return figs


def write_section(
    nhc: dict[int, dict[str, list[float]]],
    ours: dict[str, list[float]],
    costs: dict[str, dict[str, float]],
    agent: dict[str, float],
) -> None:
    """bench/results/nhc.md: the side-by-side table, appended under RESULTS.md's main table."""

    def cell(values: list[float]) -> str:
        if not values:
            return "no check"
        s = summary(values)
        return f"{s['p50']:.2f} / {s['p99']:.2f} s (n={len(values)})"

    lines = [
        "## babysitter and NHC side by side (bench.nhc, one run)",
        "",
        "fault -> drain, p50 / p99; NHC 1.4.3 as Slurm's HealthCheckProgram on other nodes of "
        "the same devcluster, same fake GPUs, same faults.",
        "",
        "| fault | babysitter (defaults) | NHC @ 60 s | NHC @ 300 s |",
        "|---|---|---|---|",
    ]
    for kind, lat in ours.items():
        cols = [cell(nhc[i].get(kind, [])) if i in nhc else "not run" for i in (60, 300)]
        lines.append(f"| {kind} | {cell(lat)} | {cols[0]} | {cols[1]} |")
    n, c = costs["nhc"], costs["babysitter_check"]
    lines += [
        "",
        "| cost | babysitter | NHC | ratio |",
        "|---|---|---|---|",
        f"| one run: CPU | {c['cpu_s']:.3f} s | {n['cpu_s']:.3f} s "
        f"| {c['cpu_s'] / n['cpu_s']:.2f} |",
        f"| one run: peak RSS | {c['peak_rss_mb']:.1f} MB | {n['peak_rss_mb']:.1f} MB "
        f"| {c['peak_rss_mb'] / n['peak_rss_mb']:.2f} |",
    ]
    if agent:
        per_min = agent["cpu_percent"] / 100 * 60
        lines.append(
            f"| live agent vs NHC@60, CPU per minute | {per_min:.3f} s "
            f"({agent['cpu_percent']:.2f} % of a core, {agent['rss_mb']:.0f} MB) "
            f"| {n['cpu_s']:.3f} s | {per_min / n['cpu_s']:.2f} |"
        )
    out = REPO / "bench" / "results" / "nhc.md"
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
