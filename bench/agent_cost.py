"""What a live agent costs at DEFAULT settings: the real `babysitter agent` process (every
thread: fast and slow tiers, NVML event thread, shipping, spool) beside its controller, on the
fake libnvidia-ml with 8 GPUs and 8 simulated IB ports, for >= 5 minutes. CPU share from
/proc/<pid>/stat (utime + stime of all threads) over the measured window, RSS from
/proc/<pid>/status, NVML calls per second from the fake's own call counts. Also one
`babysitter check --json` (the HealthCheckProgram mode): CPU and peak RSS of the child, beside
an empty Python process measured the same way.
Run: python -m bench.agent_cost [seconds]"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from babysitter.controller.api.auth import node_token
from babysitter.devcluster import simib
from babysitter.devcluster.fakenvml import FakeGpus, build, read_calls
from bench.common import figure, summary, wait_ready, write_result
from bench.wheel import WHEEL_CACHE, installed_wheel

DURATION_S = 300.0
WARMUP_S = 20.0  # start-up (imports, first full cycle) is not the steady state
CHECK_RUNS = 7
TICK = os.sysconf("SC_CLK_TCK")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """utime + stime of the whole process (all threads), /proc/<pid>/stat fields 14-15."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def rss_mb(pid: int) -> tuple[float, float]:
    """(current VmRSS, peak VmHWM) in MB."""
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            vals[k] = int(v.split()[0]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


def child_cost(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """CPU seconds and peak RSS (MB) of one child process run to its end, and its exit code.
    Through /usr/bin/time: a child forked from this (large) process would otherwise be billed
    this process's pages in its ru_maxrss before its exec."""
    with tempfile.NamedTemporaryFile("r") as out:
        p = subprocess.run(
            ["/usr/bin/time", "-o", out.name, "-f", "%U %S %M %x", *cmd],
            env=env,
            capture_output=True,
            timeout=120,
        )
        user, sys_, maxrss_kb, rc = out.read().split()[-4:]
    del p
    return float(user) + float(sys_), int(maxrss_kb) / 1024, int(rc)


def main() -> int:
    duration = float(sys.argv[1]) if len(sys.argv) > 1 else DURATION_S
    t0 = time.monotonic()
    babysitter = [sys.executable, "-m", "babysitter.cli.main"]
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        gpus = FakeGpus(work / "nvml", count=8)
        simib.make_tree(work / "sysfs", devices=8)
        (work / "kmsg").touch()
        secret = secrets.token_hex(32)
        (work / "cluster.secret").write_text(secret)
        (work / "admin.token").write_text(secrets.token_hex(16))
        for p in ("cluster.secret", "admin.token"):
            (work / p).chmod(0o600)
        (work / "node.token").write_text(node_token(secret.encode(), "n1"))
        (work / "node.token").chmod(0o600)
        port = _port()
        base = {k: v for k, v in os.environ.items() if not k.startswith("BABYSITTER_")}
        ctl_env = dict(
            base,
            BABYSITTER_CONTROLLER__LISTEN=f"127.0.0.1:{port}",
            BABYSITTER_CONTROLLER__DATABASE_URL=f"sqlite:///{work / 'ctl.db'}",
            BABYSITTER_CONTROLLER__CLUSTER_SECRET_FILE=str(work / "cluster.secret"),
            BABYSITTER_CONTROLLER__ADMIN_TOKEN_FILE=str(work / "admin.token"),
            BABYSITTER_CONTROLLER__REMEDIATION="false",
        )
        # the node's own paths only: every interval, tier and threshold stays at its default
        calls = work / "nvml-calls"
        agent_env = dict(
            base,
            **gpus.env(build(), calls=calls),
            BABYSITTER_AGENT__CONTROLLER_URL=f"http://127.0.0.1:{port}",
            BABYSITTER_AGENT__NODE_NAME="n1",
            BABYSITTER_AGENT__TOKEN_FILE=str(work / "node.token"),
            BABYSITTER_AGENT__SPOOL_PATH=str(work / "spool.db"),
            BABYSITTER_AGENT__SYSFS_ROOT=str(work / "sysfs"),
            BABYSITTER_AGENT__KMSG_PATH=str(work / "kmsg"),
            BABYSITTER_AGENT__HARDWARE_PROFILE="h100-sxm",
            BABYSITTER_CHECKS__HOST__CHECK_SLURMD="false",
            BABYSITTER_CHECKS__HOST__PATHS=json.dumps([str(work)]),
            BABYSITTER_CHECKS__GPU__EXPECTED_COUNT="8",
        )
        ctl_log = (work / "ctl.log").open("wb")
        ctl = subprocess.Popen(
            [*babysitter, "controller"], env=ctl_env, stdout=ctl_log, stderr=subprocess.STDOUT
        )
        agent = None
        try:
            wait_ready(f"http://127.0.0.1:{port}", 60, proc=ctl, log=work / "ctl.log")
            agent = subprocess.Popen(
                [*babysitter, "agent"],
                env=agent_env,
                stdout=(work / "agent.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
            time.sleep(WARMUP_S)
            if agent.poll() is not None:
                raise RuntimeError(f"agent exited: {(work / 'agent.log').read_text()[-2000:]}")
            c0, w0, n0 = cpu_s(agent.pid), time.monotonic(), read_calls(calls)
            samples = []
            while time.monotonic() - w0 < duration:
                time.sleep(10)
                samples.append(rss_mb(agent.pid)[0])
            c1, w1, n1 = cpu_s(agent.pid), time.monotonic(), read_calls(calls)
            rss_now, rss_peak = rss_mb(agent.pid)
            threads = len(os.listdir(f"/proc/{agent.pid}/task"))
        finally:
            for p in (agent, ctl):
                if p is not None:
                    p.terminate()
                    try:
                        p.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        p.kill()
        share = (c1 - c0) / (w1 - w0) * 100
        per_fn = {k: round((v - n0.get(k, 0)) / (w1 - w0), 2) for k, v in n1.items()}
        nvml_per_s = sum(per_fn.values())
        wait_per_s = per_fn.get("nvmlEventSetWait_v2", 0.0)
        # the one-shot check as a site runs it (the installed wheel's console script, compiled
        # bytecode, no editable finder), beside that venv's empty interpreter measured the same way
        (work / "wheel").mkdir()
        venv = installed_wheel(work / "wheel", cache=WHEEL_CACHE)
        empty_cpu, empty_rss, _ = child_cost([str(venv / "bin" / "python"), "-c", "pass"], base)
        check_env = dict(agent_env)
        check_env.pop("FAKE_NVML_CALLS", None)
        check = [str(venv / "bin" / "babysitter"), "check", "--json"]
        runs = [child_cost(check, check_env) for _ in range(CHECK_RUNS)]
    check_cpu = summary([r[0] for r in runs])
    check_rss = max(r[1] for r in runs)
    figs = [
        figure(
            "live agent CPU at default settings (all threads, /proc/<pid>/stat)",
            round(share, 4),
            "% of one core",
            goal="<= 0.3 %",
            met=share <= 0.3,
            window_s=round(w1 - w0, 1),
            cpu_s=round(c1 - c0, 3),
        ),
        figure(
            "live agent RSS at default settings",
            round(rss_now, 1),
            "MB",
            goal="<= 60 MB",
            met=rss_peak <= 60,
            peak_mb=round(rss_peak, 1),
            max_sampled_mb=round(max(samples), 1),
            threads=threads,
        ),
        figure(
            "live agent NVML calls (without the event wait)",
            round(nvml_per_s - wait_per_s, 2),
            "calls/s",
            event_waits_per_s=wait_per_s,
        ),
        figure(
            "one `babysitter check --json` CPU (p50)",
            round(check_cpu["p50"], 3),
            "s",
            baseline="empty python process",
            baseline_value=round(empty_cpu, 3),
            goal="<= 0.15 s",
            met=check_cpu["p50"] <= 0.15,
            **check_cpu,
        ),
        figure(
            "one `babysitter check --json` peak RSS",
            round(check_rss, 1),
            "MB",
            baseline="empty python process",
            baseline_value=round(empty_rss, 1),
            goal="<= 40 MB",
            met=check_rss <= 40,
        ),
    ]
    write_result(
        "agent_cost",
        figs,
        {"nvml_calls_per_s_by_function": per_fn, "check_exit_codes": [r[2] for r in runs]},
        settings={
            "duration_s": duration,
            "warmup_s": WARMUP_S,
            "check_runs": CHECK_RUNS,
            "agent": "default settings",
        },
        duration_s=round(time.monotonic() - t0, 1),
    )
    for f in figs:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
