"""The devcluster's `RebootProgram`: a simulated power cycle of one node that slurmctld sees as a
real reboot (notes: slurm-test-cluster.md, "A simulated reboot through `scontrol reboot`").

slurmd runs the program as root when `scontrol reboot` reaches the node. In multiple-slurmd mode
it gets no node name, so the program finds it by walking up to the `slurmd ... -N NODE` process.
It then hands the rest to a detached child and exits 0 at once (a real reboot program does not
come back either). The child stops that node's slurmd, runs the site hook (`CMD NODE`: heal the
fake GPUs, new boot id, restart the agent), and starts the slurmd again with `-b` ("report node
reboot"): without `-b` slurmctld keeps the node in `reboot^` until ResumeTimeout.

The plan (hook argv, slurmd argv, pid file pattern) is written by DevCluster into
`<base>/etc/reboot.json`, so this program needs only the base directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from babysitter.devcluster.procs import MARKER, alive, read_pid, terminate

PLAN = "reboot.json"
HOOK_TIMEOUT_S = 120.0


def program_text(base: Path) -> str:
    """The RebootProgram script (slurmd execs a path, not a command line)."""
    return f'#!/bin/sh\nexec {sys.executable} -m babysitter.devcluster.reboot "{base}" "$@"\n'


def node_of_ancestor(pid: int) -> str | None:
    """NODE of the nearest ancestor `slurmd ... -N NODE` (multiple-slurmd mode)."""
    seen = 0
    while pid > 1 and seen < 64:
        seen += 1
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        if argv and Path(argv[0].decode(errors="replace")).name == "slurmd" and b"-N" in argv:
            i = argv.index(b"-N")
            if i + 1 < len(argv):
                return argv[i + 1].decode(errors="replace")
        # field 4 of /proc/PID/stat is the parent; the name (field 2) may hold spaces
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


def _log(base: Path, node: str, text: str) -> None:
    with open(base / "log" / f"reboot-{node}.log", "a") as f:
        f.write(f"{datetime.now(UTC).isoformat()} {text}\n")


def finish(base: Path, node: str) -> int:
    """The detached part: stop slurmd, run the hook, start slurmd -b."""
    plan = json.loads((base / "etc" / PLAN).read_text())
    env = dict(os.environ, **{MARKER: plan["marker"]})
    pid = read_pid(Path(plan["pid_file"].replace("%n", node)))
    if pid and alive(pid):
        terminate([pid], grace_s=10)
    _log(base, node, "slurmd stopped; running the hook")
    code = 0
    if plan.get("hook"):
        try:
            code = subprocess.run(
                [*plan["hook"], node], env=env, timeout=HOOK_TIMEOUT_S, check=False
            ).returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            _log(base, node, f"hook failed: {exc}")
            code = 1
    _log(base, node, f"hook exit {code}; starting slurmd -b")
    argv = [a.replace("%n", node) for a in plan["slurmd"]]
    r = subprocess.run(argv, env=env, cwd=str(base), capture_output=True, text=True, timeout=30)
    _log(base, node, f"slurmd -b exit {r.returncode} {r.stderr.strip()[:300]}")
    return r.returncode


def main(argv: list[str]) -> int:
    base = Path(argv[1])
    if len(argv) > 3 and argv[2] == "--finish":
        return finish(base, argv[3])
    node = node_of_ancestor(os.getppid())
    if node is None:
        print("reboot: no `slurmd -N NODE` among my ancestors", file=sys.stderr)
        return 1
    _log(base, node, "reboot requested by slurmd")
    log = open(base / "log" / f"reboot-{node}.log", "ab")  # noqa: SIM115 - handed to the child
    subprocess.Popen(
        [sys.executable, "-m", "babysitter.devcluster.reboot", str(base), "--finish", node],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # outlives slurmd, which it stops
        cwd=str(base),
    )
    log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
