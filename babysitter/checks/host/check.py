"""Host checks: disk space, memory, slurmd alive, required mounts, clock sanity.

Read from os.statvfs and /proc directly (what psutil reads on Linux): `babysitter check` runs on
every node every few minutes, and psutil's import alone would be a tenth of its memory budget."""

from __future__ import annotations

import os
import time
from pathlib import Path

from babysitter.checks.base import Check
from babysitter.checks.host.settings import HostCheckConfig
from babysitter.finding import Action, Finding, Severity

# A clock before this is certainly wrong (no babysitter release predates it): TLS, munge
# credentials and Slurm's job timing all break on such a node.
CLOCK_FLOOR = 1735689600  # 2025-01-01T00:00:00Z


class HostCheck(Check):
    name = "host.resources"
    section = "host"
    interval_s = 60.0
    timeout_s = 15.0

    @property
    def cfg(self) -> HostCheckConfig:
        return self.ctx.config.checks.host

    def run(self) -> list[Finding]:
        out: list[Finding] = []
        cfg = self.cfg
        for p in cfg.paths:
            try:
                st = os.statvfs(p)
            except OSError as exc:
                out.append(
                    self.finding(
                        "host",
                        Severity.WARNING,
                        "disk.unreadable",
                        f"cannot stat {p}: {exc}",
                        Action.INSPECT,
                        path=str(p),
                    )
                )
                continue
            free_gb = st.f_bavail * st.f_frsize / 1e9  # what an unprivileged writer gets
            if free_gb < cfg.min_free_gb:
                out.append(
                    self.finding(
                        "host",
                        Severity.WARNING,
                        "disk.low",
                        f"{p}: {free_gb:.1f} GB free (< {cfg.min_free_gb:g} GB)",
                        Action.INSPECT,
                        path=str(p),
                        free_gb=round(free_gb, 2),
                    )
                )
        total, available = _memory()
        frac = available / total if total else 1.0
        if frac < cfg.min_free_memory_fraction:
            out.append(
                self.finding(
                    "host",
                    Severity.WARNING,
                    "memory.low",
                    f"{frac:.1%} of memory available (< {cfg.min_free_memory_fraction:.0%})",
                    Action.WATCH,
                    available_fraction=round(frac, 4),
                )
            )
        mounted = _mount_points() if cfg.mounts else set()
        for m in cfg.mounts:
            if Path(m) not in mounted:
                out.append(
                    self.finding(
                        "host",
                        Severity.CRITICAL,
                        "mount.missing",
                        f"required mount {m} is not mounted",
                        Action.DRAIN,
                        mount=str(m),
                    )
                )
        if cfg.check_slurmd and not _process_running("slurmd"):
            out.append(
                self.finding(
                    "host",
                    Severity.WARNING,
                    "slurmd.not_running",
                    "slurmd is not running",
                    Action.INSPECT,
                )
            )
        now = time.time()
        if now < CLOCK_FLOOR:
            out.append(
                self.finding(
                    "host",
                    Severity.CRITICAL,
                    "clock.wrong",
                    f"system clock reads {time.ctime(now)}",
                    Action.DRAIN,
                )
            )
        return out or [self.finding("host", Severity.OK, "host.ok", "host resources ok")]


def _memory() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in kB from /proc/meminfo (the kernel's own estimate of what
    can be allocated without swapping, as psutil's `available`)."""
    fields: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable", "MemFree"):
                fields[key] = int(rest.split()[0])
    total = fields.get("MemTotal", 0)
    return total, fields.get("MemAvailable", fields.get("MemFree", total))


def _unescape(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash as octal escapes (\\040)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mount_points() -> set[Path]:
    with open("/proc/self/mounts") as f:
        return {Path(_unescape(line.split()[1])) for line in f if len(line.split()) > 1}


def _process_running(name: str) -> bool:
    """A process whose command name (/proc/<pid>/comm, at most 15 characters) is `name`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().rstrip("\n") == name[:15]:
                    return True
        except OSError:  # gone meanwhile, or hidden (hidepid)
            continue
    return False
