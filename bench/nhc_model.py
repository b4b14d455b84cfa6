"""A model of LBNL NHC 1.4.3's verdict on one node, for the soak (bench/soak.py): NHC's checks as
bench/nhc.py configures them, plus `check_hw_ib` for each of the node's InfiniBand ports, as a
site with one HCA per GPU would write it (a bare `check_hw_ib` passes while any one port is up,
so it would not see a single port down: the ETTR model credits NHC with seeing it).

What the model reads, as NHC does: `<sys/class>/infiniband/<dev>/ports/<n>/{state,phys_state,
rate}` (NHC's `nhc_hw_gather_data`, fields split on ' :' as its bash does) and
`<sys/class>/infiniband_mad/abi_version`. NHC runs its lines in order and stops at the first
that fails; the model does the same and returns NHC's own message. The other lines pass in the
soak: the root file system stays writable, memory stays free, and the soak's benign noise never
loses a GPU or makes a DBE, which is all `check_nvsmi_healthmon`'s stand-in fails on (stated, not
compared against real NHC: tests/test_bench_nhc_model.py compares the IB lines).

`NhcArm` is NHC as Slurm's HealthCheckProgram every `interval_s` with a random phase per node:
a run that fails drains the node with a reason starting "NHC:", and a later run that passes
resumes it (NHC resumes only its own drains; this arm sees no other)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.poisson import poisson_interval, quantile

IB_RATE_GBPS = 400


def site_conf(ports: int, rate_gbps: int = IB_RATE_GBPS) -> str:
    """bench/nhc.py's nhc.conf plus a `check_hw_ib` line per expected port."""
    from bench.nhc import NHC_CONF

    lines = [f"* || check_hw_ib {rate_gbps} mlx5_{i}:1" for i in range(ports)]
    return NHC_CONF + "\n".join(lines) + "\n"


def _fields(path: Path, sep: str = " :") -> list[str]:
    """bash's `read LINE < path; IFS=' :'; FIELD=( $LINE )`."""
    try:
        line = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return []
    for c in sep[1:]:
        line = line.replace(c, " ")
    return line.split()


def ib_verdict(sys_class: Path, ports: int, rate_gbps: int = IB_RATE_GBPS) -> str | None:
    """NHC's message for the first failing `check_hw_ib` line, or None when all pass."""
    abi = _fields(sys_class / "infiniband_mad" / "abi_version")
    if not abi or not abi[0].isdigit() or int(abi[0]) == 0:
        return (
            "check_hw_ib:  Version mismatch between kernel OFED drivers and userspace OFED "
            "libraries."
        )
    up: set[tuple[str, str]] = set()
    for port in sorted((sys_class / "infiniband").glob("*/ports/*")):
        state = _fields(port / "state")
        phys = _fields(port / "phys_state")
        rate = _fields(port / "rate")
        if state[1:2] == ["ACTIVE"] and phys[1:2] == ["LinkUp"]:
            up.add((f"{port.parent.parent.name}:{port.name}", rate[0] if rate else ""))
    for i in range(ports):
        dev = f"mlx5_{i}:1"
        if (dev, str(rate_gbps)) not in up:
            return f"check_hw_ib:  No IB port {dev} is ACTIVE (LinkUp {rate_gbps} Gb/sec)."
    return None


@dataclass
class NhcArm:
    """NHC every `interval_s` on every node, each at its own random phase."""

    interval_s: float
    phase: dict[str, float]
    drains: list[dict[str, Any]] = field(default_factory=list)
    drained_since: dict[str, float] = field(default_factory=dict)
    lengths: list[float] = field(default_factory=list)
    still_drained: list[float] = field(default_factory=list)
    runs: int = 0

    @classmethod
    def new(cls, interval_s: float, nodes: list[str], seed: int, t0: float = 0.0) -> NhcArm:
        """Phases drawn from their own stream (the noise stays the same), from the run's start
        `t0`: the same seed gives the same runs relative to the noise whatever the wall clock."""
        rng = random.Random(f"nhc-{seed}-{interval_s}")
        return cls(interval_s, {n: t0 + rng.uniform(0.0, interval_s) for n in nodes})

    def runs_between(self, node: str, start: float, end: float) -> list[float]:
        """This node's run times in [start, end] and the first one after `end` (the run that
        sees the state come back)."""
        iv, ph = self.interval_s, self.phase[node]
        k = -(-(start - ph) // iv)  # ceil
        t = ph + k * iv
        out = []
        while t <= end:
            out.append(t)
            t += iv
        return [*out, t]

    def run(self, node: str, t: float, verdict: str | None) -> None:
        self.runs += 1
        if verdict is not None and node not in self.drained_since:
            self.drained_since[node] = t
            self.drains.append({"t": t, "node": node, "reason": f"NHC: {verdict}"})
        elif verdict is None and node in self.drained_since:
            self.lengths.append(t - self.drained_since.pop(node))

    def finish(self, end_t: float) -> None:
        self.still_drained += [end_t - t for t in self.drained_since.values()]

    def summary(self, node_days: float) -> dict[str, Any]:
        k = len(self.drains)
        minutes = [x / 60 for x in self.lengths + self.still_drained]
        return {
            "interval_s": self.interval_s,
            "false_drains": k,
            "false_drains_per_node_day": k / node_days if node_days > 0 else 0.0,
            "false_drains_ci95_per_node_day": list(poisson_interval(k, node_days))
            if node_days > 0
            else [0.0, float("inf")],
            "drain_minutes_p50": quantile(minutes, 0.50),
            "drain_minutes_p99": quantile(minutes, 0.99),
            "drain_minutes_max": max(minutes, default=0.0),
            "drain_hours_mean": sum(minutes) / 60 / k if k else 0.0,
            "drains_open_at_end": len(self.still_drained),
            "runs_evaluated": self.runs,
            "drains": self.drains[:50],
        }
