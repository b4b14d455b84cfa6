"""The jobs running on this node, as its own slurmd knows them: `scontrol listpids '*' <node>`.

The NCCL log check reads only these jobs' logs. A shared glob (`/scratch/*/slurm-*.out`) matches
every job's log on every node; read whole, each agent would report every job's lines as its own
(issue 42). `listpids` asks the local slurmstepds (through the slurmd spool directory; no
slurmctld round trip), names this node explicitly (several slurmd on one host, as in the dev
cluster), and prints one row per process: `PID JOBID STEPID LOCALID GLOBALID`.

Unknown (scontrol missing, failing, timing out, output unreadable) is None, and the caller
reads nothing: never everything.

A job that ended since the last look is still this node's for `RecentJobs.grace_s`: NCCL prints
its failure right before the job dies, so its last lines are read after it left listpids.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

# scontrol exits 1 with this when the node has no job step at all: a known, empty answer
NO_STEPS = "No job steps exist on this node"
_ROW = re.compile(r"^\s*\d+\s+(\d+)\b")
TIMEOUT_S = 5.0


def parse_listpids(text: str) -> frozenset[str] | None:
    """Job ids in `scontrol listpids` output; None when it is not that output."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0].split()[:2] != ["PID", "JOBID"]:
        return None
    out: set[str] = set()
    for ln in lines[1:]:
        m = _ROW.match(ln)
        if m is None:
            return None  # a row we cannot read: the whole answer is unknown
        out.add(m.group(1))
    return frozenset(out)


def jobs_on_node(
    node: str, scontrol: str = "scontrol", slurm_conf: str | None = None
) -> frozenset[str] | None:
    """Ids of the jobs with a step on `node` (run on that node); None when unknown.
    `scontrol`, `slurm_conf`: as `[slurm] bin_dir` / `slurm_conf` say (default: PATH, Slurm's
    own default)."""
    import os
    import subprocess  # only when the check runs: `babysitter check` imports this module

    env = None if slurm_conf is None else {**os.environ, "SLURM_CONF": slurm_conf}
    try:
        r = subprocess.run(
            [scontrol, "listpids", "*", node],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
            env=env,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        if NO_STEPS in r.stderr:
            return frozenset()
        # one step it could not ask (it ended meanwhile, a stale socket in the spool): the
        # rows it printed are still this node's jobs; with none, the answer is unknown
        return parse_listpids(r.stdout) or None
    return parse_listpids(r.stdout)


# how long an ended job's log is still read: its last lines (the error it died of) land late
GRACE_S = 600.0


class RecentJobs:
    """The jobs listpids showed on this node within `grace_s` (bounded: older ones are
    forgotten)."""

    def __init__(self, grace_s: float = GRACE_S, clock: Callable[[], float] = time.monotonic):
        self.grace_s = grace_s
        self.clock = clock
        self._seen: dict[str, float] = {}

    def update(self, running: frozenset[str]) -> frozenset[str]:
        """`running` now, and the jobs that ran here within grace_s."""
        t = self.clock()
        for j in running:
            self._seen[j] = t
        self._seen = {j: at for j, at in self._seen.items() if t - at <= self.grace_s}
        return frozenset(self._seen)
