"""NCCL health.

Active (invasive, only on idle/drained nodes): run nccl-tests `all_reduce_perf` when configured,
parse its table, compare the bus bandwidth at the largest size with the hardware profile's
floor.
Passive: scan the stdout/stderr files of babysat jobs running on this node for NCCL failure
signatures; each new match is a finding on `job:<id>` with the node attached. Files are found
with `[checks.nccl] job_log_globs` (e.g. "/scratch/*/slurm-*.out"); the job id is the first
number after "slurm-" (or the last number) in the file name. Only the files of jobs running on
this node (its slurmd's answer, local_jobs.py) are read: a shared glob matches every job's log,
and another node's job is not this node's to report. Job list unknown: nothing is read.
"""

from __future__ import annotations

import glob
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from babysitter.checks import unparsed
from babysitter.checks.base import Check
from babysitter.checks.nccl.local_jobs import RecentJobs, jobs_on_node
from babysitter.checks.nccl.settings import NcclCheckConfig
from babysitter.checks.nccl.signatures import match_line, names_nccl_failure
from babysitter.finding import Action, Finding, Severity

_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+(.+)$")


class PerfRow(msgspec.Struct):
    size: int
    count: int
    dtype: str
    redop: str
    busbw_oop: float
    busbw_ip: float
    wrong: int


def parse_all_reduce_perf(text: str) -> tuple[list[PerfRow], float | None]:
    """Rows of the nccl-tests table and the `# Avg bus bandwidth` line (GB/s)."""
    rows: list[PerfRow] = []
    avg = None
    for line in text.splitlines()[:100_000]:
        m = re.match(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", line)
        if m:
            try:
                avg = float(m.group(1))
            except ValueError:
                avg = None
            continue
        if line.lstrip().startswith("#"):
            continue
        m = _ROW.match(line)
        if not m:
            continue
        # out-of-place: time algbw busbw #wrong ; in-place: time algbw busbw #wrong
        nums = m.group(6).split()
        try:
            vals = [float(x) if x not in ("N/A",) else 0.0 for x in nums[:8]]
        except ValueError:
            continue
        if len(vals) < 8:
            continue
        rows.append(
            PerfRow(
                int(m.group(1)),
                int(m.group(2)),
                m.group(3),
                m.group(4),
                vals[2],
                vals[6],
                int(vals[3]) + int(vals[7]),
            )
        )
    return rows, avg


class NcclPerfCheck(Check):
    name = "nccl.perf"
    section = "nccl"
    interval_s = 3600.0
    timeout_s = 600.0
    invasive = True

    @property
    def cfg(self) -> NcclCheckConfig:
        return self.ctx.config.checks.nccl

    def supported(self) -> bool:
        return self.cfg.all_reduce_perf is not None

    def run(self) -> list[Finding]:
        exe = self.cfg.all_reduce_perf
        if exe is None:
            return []
        argv = [
            str(exe),
            "-b",
            self.cfg.min_bytes,
            "-e",
            self.cfg.max_bytes,
            "-f",
            "2",
            "-g",
            str(self.cfg.gpus),
        ]
        import subprocess  # only when the test runs: `babysitter check` imports this module

        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.effective_timeout() - 5
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [
                self.finding(
                    "host",
                    Severity.WARNING,
                    "nccl.perf_failed",
                    f"all_reduce_perf did not run: {exc}",
                    Action.INSPECT,
                )
            ]
        return self.evaluate(r.stdout, r.returncode)

    def evaluate(self, text: str, returncode: int = 0) -> list[Finding]:
        rows, avg = parse_all_reduce_perf(text)
        if returncode != 0 or not rows:
            return [
                self.finding(
                    "host",
                    Severity.WARNING,
                    "nccl.perf_failed",
                    f"all_reduce_perf exited {returncode} with {len(rows)} rows",
                    Action.INSPECT,
                )
            ]
        expected = self.ctx.expect().nccl_busbw_gbps  # the hardware profile's floor
        top = max(rows, key=lambda r: r.size)
        measured = max(top.busbw_oop, top.busbw_ip)
        wrong = sum(r.wrong for r in rows)
        out = []
        self.metrics["perf_busbw"] = {"busbw_gbps": measured, "measured_at": time.time()}
        details: dict[str, Any] = {
            "measured_gbps": measured,
            "expected_gbps": expected,
            "size_bytes": top.size,
            "avg_busbw_gbps": avg,
        }
        if wrong:
            out.append(
                self.finding(
                    "host",
                    Severity.CRITICAL,
                    "nccl.wrong_results",
                    f"all_reduce_perf reported {wrong} wrong results",
                    Action.DRAIN,
                    wrong=wrong,
                    **details,
                )
            )
        if measured < expected:
            out.append(
                self.finding(
                    "host",
                    Severity.WARNING,
                    "nccl.busbw_low",
                    f"all_reduce bus bandwidth {measured:.1f} GB/s at {top.size} B, "
                    f"{expected:.0f} GB/s expected",
                    Action.INSPECT,
                    **details,
                )
            )
        return out or [
            self.finding(
                "host",
                Severity.OK,
                "nccl.perf_ok",
                f"all_reduce bus bandwidth {measured:.1f} GB/s (>= {expected:.0f})",
                **details,
            )
        ]


class JobLogScanner:
    """Remembers how far each file was read, so a signature is reported once."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}

    def scan(self, job_id: str, path: Path, node: str) -> list[Finding]:
        key = str(path)
        try:
            size = path.stat().st_size
            start = self.offsets.get(key, 0)
            if size < start:  # truncated (requeue without --open-mode=append)
                start = 0
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(16 * 1024 * 1024)
            self.offsets[key] = start + len(data)
        except OSError:
            return []
        out: list[Finding] = []
        seen: set[str] = set()
        for line in data.decode("utf-8", "replace").splitlines():
            hit = match_line(line)
            if hit is None:
                # a failure in a wording no signature knows: counted and sampled for the admin
                # (unparsed.py), never silently dropped
                if names_nccl_failure(line):
                    unparsed.note("job_log", line.strip())
                continue
            code, sev = hit
            if code in seen:
                continue
            seen.add(code)
            out.append(
                Finding(
                    check="nccl.logs",
                    component=f"job:{job_id}",
                    severity=sev,
                    code=code,
                    message=f"job {job_id} on {node}: {line.strip()[:300]}",
                    action=Action.REQUEUE_JOB if sev is Severity.CRITICAL else Action.WATCH,
                    details={"node": node, "job_id": job_id, "file": key},
                )
            )
        return out


def job_id_of(path: Path) -> str | None:
    m = re.search(r"slurm-(\d+)", path.name) or re.search(r"(\d+)(?!.*\d)", path.name)
    return m.group(1) if m else None


class NcclLogCheck(Check):
    name = "nccl.logs"
    section = "nccl"
    interval_s = 30.0
    timeout_s = 20.0

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.scanner = JobLogScanner()
        self.recent = RecentJobs()  # a job that just ended: its last lines are still read
        # the ids of the jobs running on this node; None: unknown (tests and simulations
        # replace it)
        sl = self.ctx.config.slurm
        scontrol = str(sl.bin_dir / "scontrol") if sl.bin_dir else "scontrol"
        conf = str(sl.slurm_conf) if sl.slurm_conf else None
        self.local_jobs: Callable[[], frozenset[str] | None] = lambda: jobs_on_node(
            self.ctx.node_name, scontrol, conf
        )

    def supported(self) -> bool:
        return bool(self.ctx.config.checks.nccl.job_log_globs)

    def run(self) -> list[Finding]:
        mine = self.local_jobs()
        if mine is None:
            # never everything: another node's job log is not this node's to report. A
            # warning, so the controller keeps it (it stores only what is above INFO) and the
            # node shows as suspect: its jobs' NCCL failures are not being seen. Node-level,
            # never drains, not a job's alert (finding.NODE_CODES_OF_JOB_CHECKS)
            return [
                self.finding(
                    "host",
                    Severity.WARNING,
                    "nccl.logs_skipped",
                    "job logs not read: the jobs running on this node are unknown "
                    "(scontrol listpids failed): its jobs' NCCL failures are not seen",
                )
            ]
        mine = self.recent.update(mine)
        out: list[Finding] = []
        if not mine:
            return out
        for pattern in self.ctx.config.checks.nccl.job_log_globs:
            names = [n for n in sorted(glob.glob(pattern)) if job_id_of(Path(n)) in mine]
            for name in names[:10_000]:
                p = Path(name)
                jid = job_id_of(p)
                if jid:
                    out.extend(self.scanner.scan(jid, p, self.ctx.node_name))
        seen_unparsed = unparsed.REGISTRY.snapshot()
        if seen_unparsed:
            self.metrics["unparsed_lines"] = seen_unparsed
        return out
