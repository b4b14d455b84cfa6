"""A simulated 10,000-node cluster: a 32-node rack fails at once. Time until every decision is
made and executed against a Slurm stand-in (bench/slurm_standin.py, 10k nodes cannot run here),
the blast-radius guard respected, and the controller's peak memory; beside a steady-state tick
of the same cluster with no failure, measured in the same run.
Run: python -m bench.rack_failure"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from babysitter.config import Config
from babysitter.controller.remediation import make_engine
from babysitter.controller.store import Report, Store
from babysitter.finding import Finding
from bench.common import figure, write_result
from bench.slurm_standin import InMemorySlurm

N = 10_000
RACK = range(5000, 5032)
SLURM_CALL_S = 0.005  # per-call latency of the stand-in, like a slurmctld round trip

DBE = Finding(
    check="gpu.memory",
    component="gpu3",
    severity="critical",
    code="ecc.dbe.volatile",
    message="GPU 3: 1 volatile uncorrected ECC error",
    action="reset_gpu",
)


def main() -> int:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        store = Store(f"sqlite:///{Path(d) / 'rack.db'}")
        store.upgrade()
        names = [f"n{i:05d}" for i in range(N)]
        now = datetime.now(UTC)
        for k in range(0, N, 1000):
            store.ingest([Report(n, str(uuid.uuid4()), now, [], {}) for n in names[k : k + 1000]])
        slurm = InMemorySlurm(names, call_latency_s=SLURM_CALL_S)
        cfg = Config.model_validate(
            {"policy": {"max_drained_fraction": 0.1, "max_drains_per_hour": 100}}
        )
        engine = make_engine(cfg, store, slurm=slurm)
        t = time.perf_counter()
        engine.tick()
        steady = time.perf_counter() - t
        store.ingest(
            [Report(names[i], str(uuid.uuid4()), datetime.now(UTC), [DBE], {}) for i in RACK]
        )
        t = time.perf_counter()
        engine.tick()
        handled = time.perf_counter() - t
        drained = [n for n in slurm.nodes() if n.drained_or_draining]
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        # a tight guard: 0.2 % of the partition = 20 nodes
        cfg2 = Config.model_validate(
            {"policy": {"max_drained_fraction": 0.002, "max_drains_per_hour": 100}}
        )
        slurm2 = InMemorySlurm(names)
        store.kv_set("guard_tripped", False)
        for n in names:
            store.set_node(n, babysitter_drained=False)
        engine2 = make_engine(cfg2, store, slurm=slurm2)
        engine2.tick()
        guarded = [n for n in slurm2.nodes() if n.drained_or_draining]
        store.close()
    figs = [
        figure(
            "32-node rack failure in 10k nodes: decided and executed",
            handled,
            "s",
            baseline="steady-state tick, no failure",
            baseline_value=steady,
            goal="<= 5 s",
            met=handled <= 5.0,
        ),
        figure(
            "nodes drained (limit 10 % = 1000)",
            len(drained),
            "nodes",
            goal="= 32",
            met=len(drained) == 32,
        ),
        figure(
            "nodes drained with a 0.2 % guard (limit 20)",
            len(guarded),
            "nodes",
            goal="<= 20",
            met=len(guarded) <= 20,
        ),
        figure("controller peak RSS", peak_mb, "MB"),
    ]
    write_result(
        "rack_failure",
        figs,
        {"nodes": N, "rack": len(RACK), "slurm_call_latency_s": SLURM_CALL_S},
        duration_s=round(time.monotonic() - t0, 1),
    )
    for f in figs:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
