"""Host checks (psutil): disk space, memory, slurmd alive, required mounts, clock sanity."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from babysitter.checks.base import Check
from babysitter.config import HostCheckConfig
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
                du = psutil.disk_usage(str(p))
            except (FileNotFoundError, PermissionError, OSError) as exc:
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
            free_gb = du.free / 1e9
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
        vm = psutil.virtual_memory()
        frac = vm.available / vm.total if vm.total else 1.0
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
        mounted = {Path(m.mountpoint) for m in psutil.disk_partitions(all=True)}
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


def _process_running(name: str) -> bool:
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] == name:
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False
