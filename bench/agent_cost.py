"""Agent cost per check cycle on 8 simulated GPUs (fake NVML through the real pynvml) + 8
simulated IB ports: CPU ms and peak RSS, beside an empty Python process measured in the same
run, and the CPU share at the default check intervals.
Run: python -m bench.agent_cost"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from babysitter.devcluster import simib
from babysitter.devcluster.fakenvml import FakeGpus, build
from bench.common import figure, summary, write_result

CYCLES = 30

PROBE = r"""
import json, resource, sys, time
from babysitter.config import load_config
from babysitter.checks.all import select_checks
from babysitter.checks.base import CheckContext, run_check
cfg = load_config()
checks = select_checks(CheckContext(cfg, "n1"))
for c in checks:  # warm-up: NVML init, imports
    run_check(c)
per_check = {c.name: [] for c in checks}
cycles = []
for _ in range(int(sys.argv[1])):
    t_cycle = time.process_time()
    for c in checks:
        t = time.process_time()
        run_check(c)
        per_check[c.name].append(time.process_time() - t)
    cycles.append(time.process_time() - t_cycle)
rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"cycles": cycles, "per_check": per_check, "rss_mb": rss_kb / 1024,
                  "intervals": {c.name: c.effective_interval() for c in checks}}))
"""

EMPTY = r"""
import json, resource, time
t = time.process_time()
print(json.dumps({"cpu_s": time.process_time() - t,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> int:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        gpus = FakeGpus(work / "nvml", count=8)
        simib.make_tree(work / "sysfs", devices=8)
        (work / "kmsg").touch()
        env = dict(
            os.environ,
            **gpus.env(build()),
            BABYSITTER_AGENT__SYSFS_ROOT=str(work / "sysfs"),
            BABYSITTER_AGENT__KMSG_PATH=str(work / "kmsg"),
            BABYSITTER_CHECKS__INFINIBAND__PROFILE="H100",
            BABYSITTER_CHECKS__HOST__CHECK_SLURMD="false",
            BABYSITTER_CHECKS__GPU__EXPECTED_COUNT="8",
        )
        env.pop("BABYSITTER_CONFIG", None)
        out = subprocess.run(
            [sys.executable, "-c", PROBE, str(CYCLES)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        probe = json.loads(out.stdout.strip().splitlines()[-1])
        empty = json.loads(
            subprocess.run(
                [sys.executable, "-c", EMPTY],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        )
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
        empty_start_s = time.perf_counter() - t
    cyc = [c * 1000 for c in probe["cycles"]]
    s = summary(cyc)
    share = sum(
        (sum(v) / len(v)) / probe["intervals"][name] for name, v in probe["per_check"].items()
    )
    figs = [
        figure(
            "agent CPU per full check cycle (8 GPUs + 8 IB ports)",
            s["p50"],
            "ms",
            goal="<= 15 ms",
            met=s["p50"] <= 15,
            **s,
        ),
        figure(
            "agent peak RSS",
            probe["rss_mb"],
            "MB",
            baseline="empty python process RSS",
            baseline_value=empty["rss_mb"],
            goal="<= 60 MB",
            met=probe["rss_mb"] <= 60,
        ),
        figure("agent CPU share at default intervals", share * 100, "% of one core"),
    ]
    write_result(
        "agent_cost",
        figs,
        {
            "per_check_ms_p50": {
                k: round(summary([x * 1000 for x in v])["p50"], 3)
                for k, v in probe["per_check"].items()
            },
            "intervals_s": probe["intervals"],
            "empty_python_start_s": empty_start_s,
        },
        duration_s=round(time.monotonic() - t0, 1),
    )
    for f in figs:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
