"""The `restart_fabric` rung on the node: the controller orders a restart of
nvidia-fabricmanager or nvidia-imex in its answer to a report (controller/api/orders.py,
controller/loop/heal/fabric_rung.py); the agent, never the controller over ssh, runs `systemctl
restart` under a time limit, and only where the node's hardware profile says it runs that
service and no GPU has a process on it (a restart retrains the fabric under a running job).
Anything it cannot tell is a refusal, never a restart: the controller then climbs to the next
rung (a reboot through Slurm)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from babysitter.config import Config
from babysitter.finding import Finding, Severity

log = logging.getLogger(__name__)

ORDER = "fabric.restart"  # the order's `check` (controller/loop/heal/fabric_rung.py ORDER)
METRIC = "fabric_restart"  # the answer, in every later report's metrics until the next order
FABRIC_MANAGER = "nvidia-fabricmanager"
IMEX = "nvidia-imex"


@dataclass(frozen=True)
class RestartOutcome:
    order: str
    ok: bool
    refused: bool  # not tried at all: nothing changed
    message: str
    units: tuple[str, ...] = ()
    duration_s: float = 0.0

    def finding(self) -> Finding:
        code = (
            "fabric.restart.done"
            if self.ok
            else ("fabric.restart.refused" if self.refused else "fabric.restart.failed")
        )
        return Finding(
            check=ORDER,
            component="host",
            severity=Severity.INFO,
            code=code,
            message=self.message,
            details={"order": self.order, "units": list(self.units)},
        )

    def metric(self) -> dict[str, Any]:
        return {**asdict(self), "units": list(self.units)}


def _runs(cfg: Config, unit: str) -> bool | None:
    """Whether this node runs `unit`, by its hardware profile (None: a detected profile that
    may run Fabric Manager: the driver's fabric says, so it is tried)."""
    from babysitter.checks.profile import expectations, gpu_model

    name = None if cfg.agent.hardware_profile else gpu_model()
    exp = expectations(cfg, name)
    if unit == IMEX:
        return exp.imex
    return exp.fabric_manager if exp.fabric_manager is not None or exp.nvswitch else False


def _busy() -> str:
    """Why a restart must wait: processes on a GPU, or NVML unable to say ("" when idle)."""
    import pynvml

    from babysitter.checks import nvml

    try:
        devs, lost = nvml.devices()
        if lost:  # a GPU NVML cannot open may still run a job: its processes are unknown
            return f"NVML cannot open GPU {lost[0].index}: {lost[0].error}"
        for d in devs:
            n = len(pynvml.nvmlDeviceGetComputeRunningProcesses(d.handle))
            if n:
                return f"{n} process(es) on GPU {d.index}"
    except (pynvml.NVMLError, nvml.NvmlUnavailable) as exc:
        return f"NVML cannot list the GPUs' processes: {exc}"
    return ""


def carry_out(
    cfg: Config,
    order: dict[str, Any],
    runs: Callable[[Config, str], bool | None] = _runs,
    busy: Callable[[], str] = _busy,
) -> RestartOutcome:
    oid = str(order.get("id", ""))[:64]
    raw = order.get("units")
    units = tuple(u for u in (raw if isinstance(raw, list) else []) if u in (FABRIC_MANAGER, IMEX))

    def refuse(why: str) -> RestartOutcome:
        log.warning("fabric restart order %s refused: %s", oid, why)
        return RestartOutcome(oid, False, True, f"fabric service restart refused: {why}", units)

    if not units:
        return refuse("the order names no service this agent restarts")
    for unit in units:
        if runs(cfg, unit) is False:
            return refuse(f"this node does not run {unit} (hardware profile)")
    if why := busy():
        return refuse(why)
    fab = cfg.checks.fabric
    exe = shutil.which(fab.systemctl)
    if exe is None:
        return refuse(f"no {fab.systemctl} here")
    t0 = time.monotonic()

    def done(ok: bool, message: str) -> RestartOutcome:
        return RestartOutcome(oid, ok, False, message, units, round(time.monotonic() - t0, 3))

    for unit in units:
        log.warning("fabric restart order %s: systemctl restart %s", oid, unit)
        try:
            r = subprocess.run(
                [exe, "restart", unit],
                capture_output=True,
                text=True,
                timeout=fab.restart_timeout_s,
                check=False,
            )
            state = subprocess.run(
                [exe, "is-active", unit],
                capture_output=True,
                text=True,
                timeout=fab.command_timeout_s,
                check=False,
            ).stdout.strip()
        except subprocess.TimeoutExpired:
            return done(False, f"restart of {unit} timed out after {fab.restart_timeout_s:g} s")
        except OSError as exc:
            return done(False, f"cannot run {exe}: {exc.strerror}")
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
            return done(False, f"restart of {unit} failed (exit {r.returncode}): {tail[0][:200]}")
        if state != "active":
            return done(False, f"{unit} is {state or 'in an unknown state'} after its restart")
    return done(True, f"{', '.join(units)} restarted")


class Restarter:
    """One restart at a time, on a thread of its own (a restart may take a minute; the
    shipper's thread that hands the order over must not wait for it)."""

    def __init__(self, cfg: Callable[[], Config], report: Callable[[Finding], None]) -> None:
        self.cfg = cfg  # the agent's current config (a reload replaces it)
        self.report = report
        self.outcome: dict[str, Any] | None = None  # the last order's answer, for the metrics
        self._lock = threading.Lock()

    def start(self, order: dict[str, Any]) -> None:
        if not self._lock.acquire(blocking=False):
            oid = str(order.get("id", ""))[:64]
            self._done(RestartOutcome(oid, False, True, "fabric restart refused: one is running"))
            return

        def run() -> None:
            try:
                self._done(carry_out(self.cfg(), order))
            finally:
                self._lock.release()

        threading.Thread(target=run, name="fabric-restart", daemon=True).start()

    def _done(self, out: RestartOutcome) -> None:
        self.outcome = out.metric()
        self.report(out.finding())
