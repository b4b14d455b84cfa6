"""Cost of one fabric-correlation decision (loop/decide/fabric.py `correlate`) as the fat tree
grows from 2,048 to 32,768 nodes (leaves of 32 under one spine): the same fault picture each
time (one failing leaf, a few stray faults, one open incident), so a flat cost shows the
decision pays for the evidence, not for the tree. Also the cost of reading the topology
(`scontrol show topology` text parsed into node -> switch chains), paid once per
fabric.topology_refresh_s. Run: python -m bench.fabric_scale"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta

from babysitter.controller.loop.decide.fabric import Evidence, FabricSettings, Incident, correlate
from babysitter.slurm.topology import Topology, parse_topology
from bench.common import figure, summary, write_result

SIZES = (2048, 8192, 32768)
PER_LEAF = 32
ROUNDS = 30  # timing samples per size
CALLS = 50  # decisions per sample
T0 = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)


def topology_text(nodes: int) -> str:
    """What `scontrol show topology` prints for the tree (22.05 format)."""
    leaves = nodes // PER_LEAF
    lines = [
        f"SwitchName=leaf{i} Level=0 LinkSpeed=1 Nodes=n[{i * PER_LEAF:05d}-"
        f"{(i + 1) * PER_LEAF - 1:05d}]"
        for i in range(leaves)
    ]
    lines.append(
        f"SwitchName=spine Level=1 LinkSpeed=1 Nodes=n[00000-{nodes - 1:05d}] "
        f"Switches=leaf[0-{leaves - 1}]"
    )
    return "\n".join(lines) + "\n"


def picture(topo: Topology, nodes: int) -> tuple[dict[str, Evidence], list[Incident]]:
    """One leaf failing (all 32 reported), three stray node faults, one open incident."""
    failing = sorted(topo.switches["leaf1"].nodes)
    stray = [f"n{i:05d}" for i in (nodes // 2, nodes // 3, nodes - 1)]
    evidence = {n: Evidence(n, T0, ("ib.port_down",)) for n in failing}
    evidence |= {n: Evidence(n, T0 + timedelta(seconds=5), ("ib.port_down",)) for n in stray}
    open_ = [Incident("leaf3", 0, frozenset(sorted(topo.switches["leaf3"].nodes)[:4]), T0)]
    return evidence, open_


def main() -> int:
    s = FabricSettings()
    figs = []
    per_size: dict[int, float] = {}
    for nodes in SIZES:
        text = topology_text(nodes)
        t = time.perf_counter()
        topo = parse_topology(text)
        parse_s = time.perf_counter() - t
        evidence, open_ = picture(topo, nodes)
        now = T0 + timedelta(seconds=20)
        samples = []
        for _ in range(ROUNDS):
            t = time.perf_counter()
            for _ in range(CALLS):
                view = correlate(topo, evidence, open_, {}, s, now)
            samples.append((time.perf_counter() - t) / CALLS * 1e6)
        assert [i.switch for i in view.opened] == ["leaf1"], view.opened
        st = summary(samples)
        per_size[nodes] = st["min"]  # the least disturbed sample: this box is shared
        figs.append(
            figure(
                f"one correlation decision, {nodes:,} nodes ({nodes // PER_LEAF} leaves)",
                st["p50"],
                "us",
                **{k: v for k, v in st.items() if k != "n"},
                n=st["n"],
            )
        )
        figs.append(figure(f"parse `scontrol show topology`, {nodes:,} nodes", parse_s, "s"))
    ratio = per_size[SIZES[-1]] / per_size[SIZES[0]]
    figs.append(
        figure(
            f"decision cost (fastest sample) at {SIZES[-1]:,} nodes over {SIZES[0]:,} nodes",
            ratio,
            "x",
            goal="<= 2 (flat: cost follows the evidence, not the tree)",
            met=ratio <= 2,
        )
    )
    settings = {"sizes": list(SIZES), "per_leaf": PER_LEAF, "rounds": ROUNDS, "calls": CALLS}
    write_result("fabric_scale", figs, settings, settings=settings)
    for f in figs:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
