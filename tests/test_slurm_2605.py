"""Slurm 26.05's HealthCheckNodeState=REBOOT_ONLY on a real 26.05 cluster (Debian sid root).

The 26.05 daemons run chrooted in a Debian root that holds no babysitter, so the
HealthCheckProgram here is a stand-in shell program that records when slurmd runs it (babysitter's
own mode at START_ONLY runs for real on 25.11: tests/test_slurm_2026.py). The reboot is
babysitter's own `scontrol reboot ASAP` through its client, completed by a RebootProgram that
restarts the node's slurmd as rebooted (`slurmd -b`) inside the root."""

from __future__ import annotations

from pathlib import Path

from babysitter.devcluster import DevCluster
from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.slurm import running, slurm, wait_for

PROGRAM = """#!/bin/sh
echo "hc $SLURMD_NODENAME" >> {hc}/runs
exit 0
"""

# multiple-slurmd mode gives the RebootProgram no node name: it is found on the ancestor
# `slurmd ... -N NODE`, which a shell in a session of its own replaces by `slurmd -b`
REBOOT = """#!/bin/sh
p=$PPID
while [ "$p" -gt 1 ]; do
  cmd=$(tr '\\0' ' ' < /proc/$p/cmdline)
  case "$cmd" in *slurmd*" -N "*) break;; esac
  p=$(cut -d' ' -f4 /proc/$p/stat)
done
node=${{cmd##* -N }}; node=${{node%% *}}
echo "reboot $node" >> {hc}/runs
mark={hc}/detached.$$
setsid sh -c "touch $mark; kill $p; while kill -0 $p 2>/dev/null; do sleep 0.2; done; \\
  exec /usr/sbin/slurmd -b -f {conf} -N $node" >/dev/null 2>&1 < /dev/null &
# slurmd kills this program's process group when it exits: wait until the child has left it
while [ ! -e "$mark" ]; do sleep 0.05; done
exit 0
"""


def test_reboot_only_health_check_runs_after_a_reboot_not_at_start(slurm_daemons, tmp_path):
    base = tmp_path / "c26"
    hc = base / "hc"  # inside the cluster's base: bind-mounted at the same path in the root
    hc.mkdir(parents=True)
    for name, text in (("hc.sh", PROGRAM), ("reboot.sh", REBOOT)):
        (hc / name).write_text(text.format(hc=hc, conf=base / "etc" / "slurm.conf"))
        (hc / name).chmod(0o755)
    runs = hc / "runs"
    cluster = DevCluster(
        base,
        nodes=2,
        slurm="26.05",
        extra_conf=[
            f"HealthCheckProgram={hc / 'hc.sh'}",
            "HealthCheckInterval=2",  # were REBOOT_ONLY ignored, it would run every 2 s
            "HealthCheckNodeState=REBOOT_ONLY",
            f"RebootProgram={hc / 'reboot.sh'}",
            "ResumeTimeout=60",
        ],
    )
    with running(cluster) as info:
        config = slurm(info, "scontrol", "show", "config").stdout
        assert "HealthCheckNodeState    = REBOOT_ONLY" in config
        # every slurmd started and registered (the nodes are idle): none ran the program
        assert not runs.exists()
        cl = CliSlurmClient(slurm_conf=Path(info.slurm_conf), bin_dir=Path(info.bin or ""))
        cl.reboot("node2", "gpu.memory: test", "RESUME")
        wait_for(lambda: runs.exists() and "hc node2" in runs.read_text(), 60, "health check")
        assert runs.read_text().split("\n")[:-1] == ["reboot node2", "hc node2"]
        wait_for(lambda: not cl.node("node2").flags, 60, "node2 back, no reboot flags")
