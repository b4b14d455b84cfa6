"""`gpu.fabric`: the NVSwitch fabric of a node whose hardware profile has one (HGX
H100/H200/B200/A100, GB200/GB300 NVL72): each GPU's fabric training state, status, health
mask and health summary (NVML), the `nvidia-fabricmanager` service where the node runs it, and
`nvidia-imex` with its domain where the node needs it. A profile without NVSwitch reads
nothing. What each reading means is judge.py's; this module only reads.

Every GPU in a fabric ships its NVLink domain (the fabric's cluster UUID and clique id) with
the report (metric `nvlink_domain`) and in its findings' details: the controller groups nodes
into NVLink domains by it (controller/loop/fabric/nvlink_domain.py).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

from babysitter.checks import nvml
from babysitter.checks.base import Check
from babysitter.checks.fabric import judge
from babysitter.checks.fabric.settings import FabricCheckConfig
from babysitter.checks.fabric.tiers import SIGNALS
from babysitter.checks.nvml import NOT_SUPPORTED, Device, call, nv
from babysitter.finding import Action, Finding, Severity

FABRIC_MANAGER_UNIT = "nvidia-fabricmanager"
IMEX_UNIT = "nvidia-imex"


def _uptime_s() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class FabricInfo:
    """One GPU's fabric info (the V struct where the driver has it: with the health mask, and
    from v3 on the health summary; None where the struct has no summary)."""

    __slots__ = ("clique", "cluster", "mask", "state", "status", "summary")

    def __init__(
        self,
        state: int,
        status: int,
        clique: int,
        cluster: str | None,
        mask: int,
        summary: int | None = None,
    ):
        self.state, self.status, self.clique, self.cluster = state, status, clique, cluster
        self.mask, self.summary = mask, summary

    @property
    def domain(self) -> str | None:
        """The NVLink domain: cluster UUID and clique id (None without a cluster UUID)."""
        return f"{self.cluster}/{self.clique}" if self.cluster else None


def _read_v(dev: Device) -> tuple[Any, Any, int | None]:
    """The V call with the newest struct the driver takes: v3 (with the health summary), else
    v2 (a driver that answers ArgumentVersionMismatch to v3). (info, NVML's answer, summary)"""
    v3 = getattr(nv, "c_nvmlGpuFabricInfo_v3_t", None)  # an older nvidia-ml-py has none
    if v3 is not None:
        try:
            info: Any = v3()
            got = call(nv.nvmlDeviceGetGpuFabricInfoV, dev.handle, nv.byref(info))
            return info, got, int(info.healthSummary)
        except nv.NVMLError_ArgumentVersionMismatch:
            pass
    info = nv.c_nvmlGpuFabricInfo_v2_t()
    return info, call(nv.nvmlDeviceGetGpuFabricInfoV, dev.handle, nv.byref(info)), None


def read_fabric(dev: Device) -> FabricInfo:
    """NVML's fabric info of one GPU; NOT_SUPPORTED state where the driver has none."""
    try:
        info, got, summary = _read_v(dev)
        mask = int(info.healthMask)
    except (nv.NVMLError_FunctionNotFound, nv.NVMLError_ArgumentVersionMismatch):
        info = nv.c_nvmlGpuFabricInfo_t()  # a driver before the V call (< r550): no mask
        got = call(nv.nvmlDeviceGetGpuFabricInfo, dev.handle, nv.byref(info))
        mask, summary = 0, None
    if got is NOT_SUPPORTED:
        return FabricInfo(judge.NOT_SUPPORTED, 0, 0, None, 0)
    cluster = judge.cluster_uuid(bytes(info.clusterUuid))
    return FabricInfo(int(info.state), int(info.status), int(info.cliqueId), cluster, mask, summary)


class GpuFabricCheck(Check):
    name = "gpu.fabric"
    section = "fabric"
    signals = SIGNALS
    interval_s = 10.0
    timeout_s = 20.0  # two commands of command_timeout_s each, plus the NVML reads
    clock = staticmethod(time.monotonic)
    uptime = staticmethod(_uptime_s)

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._pending_since: dict[str, float] = {}  # per GPU UUID: first seen not COMPLETED
        self._in_fabric = False  # a GPU reported a fabric state (the driver knows a fabric)
        self._gpus: list[Device] = []
        self._services_read = False
        self._required = False  # a GPU's fabric state must be known (run() sets it)

    def settings(self) -> FabricCheckConfig:
        return self.ctx.config.checks.fabric

    def run(self) -> list[Finding]:
        expect = self.ctx.expect()
        if not expect.nvswitch:
            return []  # no NVSwitch fabric on this hardware: nothing to judge, nothing to say
        due = self.begin()
        cfg = self.settings()
        # a configured fabric with no Fabric Manager here (an NVL72 tray): the GPUs' fabric
        # state is its only evidence, so NOT_SUPPORTED is unknown, not "no fabric"
        self._required = expect.source == "configured" and expect.fabric_manager is False
        if "state" in due:
            self._read_states(cfg)
        fabric_manager = expect.fabric_manager
        if fabric_manager is None:  # a detected profile: the driver says whether a fabric is
            fabric_manager = self._in_fabric
        if "fabric_manager" in due:
            found = (
                self._service(cfg, FABRIC_MANAGER_UNIT, "fabric_manager") if fabric_manager else []
            )
            self.keep("fabric_manager", "host", found)
        if "imex" in due:
            self.keep("imex", "host:imex", self._imex(cfg) if expect.imex else [])
        out: list[Finding] = []
        for dev in self._gpus:
            out.extend(self.kept(dev.index))
        services = self.kept("host") + self.kept("host:imex")
        out.extend(f for f in services if f.severity is not Severity.OK)
        if self._services_read and all(f.severity is Severity.OK for f in services):
            out.append(self.steady_ok("host", "fabric.services_ok", "fabric services ok"))
        return out

    # ---- per GPU
    def _read_states(self, cfg: FabricCheckConfig) -> None:
        try:
            devs, lost = nvml.devices(5.0)
        except nvml.NvmlUnavailable:
            self._gpus = []
            return  # gpu.presence reports the driver
        for gone in lost:
            self.forget(gone.index)
        self._gpus = devs
        domains: set[str] = set()
        for dev in devs:
            try:
                info = read_fabric(dev)
            except nv.NVMLError_GpuIsLost:
                self.forget(dev.index)
                continue
            except nv.NVMLError as exc:
                self.keep("state", dev.index, [self._nvml_error(dev, exc)])
                continue
            if info.state != judge.NOT_SUPPORTED:
                self._in_fabric = True
            if info.domain:
                domains.add(info.domain)
            self.keep("state", dev.index, self._judge(dev, info, cfg))
        if domains:
            # the node's NVLink domain(s), shipped with every report: the controller's
            # correlation scope (one domain on a healthy node; several is itself a finding)
            self.metrics["nvlink_domain"] = sorted(domains)[0]
        else:
            self.metrics.pop("nvlink_domain", None)

    def _pending_s(self, dev: Device, info: FabricInfo) -> float:
        """How long this GPU's fabric has been untrained. IN_PROGRESS counts from when the
        check first saw it so (Fabric Manager retrains after a restart). NOT_STARTED first
        seen counts from boot: Fabric Manager trains the fabric once after boot, so one that
        has not even started since is not about to (and a one-shot run, which sees every
        state for the first time, still alarms past the grace)."""
        if info.state not in (judge.NOT_STARTED, judge.IN_PROGRESS):
            self._pending_since.pop(dev.uuid, None)
            return 0.0
        now = self.clock()
        since = self._pending_since.get(dev.uuid)
        if since is None:
            up = self.uptime() if info.state == judge.NOT_STARTED else None
            since = self._pending_since[dev.uuid] = now - (up or 0.0)
        return now - since

    def _judge(self, dev: Device, info: FabricInfo, cfg: FabricCheckConfig) -> list[Finding]:
        pending = self._pending_s(dev, info)
        verdicts = judge.gpu_fabric(
            info.state, info.status, info.mask, info.summary, pending, cfg.grace_s, self._required
        )
        details: dict[str, Any] = {
            "fabric_state": judge.STATE_NAMES.get(info.state, str(info.state)),
            "clique_id": info.clique,
        }
        if info.cluster:
            details["cluster_uuid"] = info.cluster
            details["nvlink_domain"] = info.domain
        if info.status:
            details["fabric_status"] = info.status
        if info.state == judge.COMPLETED and any(v.fault for v in verdicts):
            details["health_mask"] = hex(info.mask)
            if info.summary is not None:
                details["health_summary"] = info.summary
        out = []
        for v in verdicts:
            if v.severity is Severity.OK:
                out.append(
                    self.steady_ok(
                        dev.component, v.code, f"{dev.label}: {v.message}", **dev.ids(), **details
                    )
                )
            else:
                out.append(
                    self.finding(
                        dev.component,
                        v.severity,
                        v.code,
                        f"{dev.label}: {v.message}",
                        v.action,
                        **dev.ids(),
                        **details,
                    )
                )
        return out

    def _nvml_error(self, dev: Device, exc: Any) -> Finding:
        return self.finding(
            dev.component,
            Severity.WARNING,
            "fabric.nvml_error",
            f"{dev.label}: NVML error reading the fabric state: {exc}",
            Action.INSPECT,
            **dev.ids(),
            nvml_error=getattr(exc, "value", None),
        )

    # ---- services
    def _command(self, cfg: FabricCheckConfig, argv: list[str]) -> str | None:
        """A command's stdout (None: it could not run, timed out or printed nothing)."""
        exe = shutil.which(argv[0])
        if exe is None:
            return None
        try:
            done = subprocess.run(
                [exe, *argv[1:]],
                capture_output=True,
                text=True,
                timeout=cfg.command_timeout_s,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout[:65536] or None

    def _service(self, cfg: FabricCheckConfig, unit: str, code: str) -> list[Finding]:
        self._services_read = True
        out = self._command(cfg, [cfg.systemctl, "is-active", unit])
        v = judge.service(unit, out, code)
        return [self.finding("host", v.severity, v.code, v.message, v.action, unit=unit)]

    def _imex(self, cfg: FabricCheckConfig) -> list[Finding]:
        out = self._service(cfg, IMEX_UNIT, "imex")
        if out[0].severity is Severity.OK:
            v = judge.imex_domain(self._command(cfg, [cfg.imex_ctl, "-N", "-j"]))
            out.append(self.finding("host", v.severity, v.code, v.message, v.action))
        return out
