"""GPU checks through NVML (nvidia-ml-py): presence/lost, memory (ECC, retired pages, row
remapping), NVLink, PCIe and thermals/clock-event reasons.

Every healthy GPU gets an `ok` finding so the controller sees the fault is gone. A lost GPU is
reported by `gpu.presence` only; the other checks skip it.
"""

from __future__ import annotations

from typing import Any

import pynvml

from babysitter.checks import nvml
from babysitter.checks.base import Check
from babysitter.checks.nvml import NOT_SUPPORTED, Device, call
from babysitter.finding import Action, Finding, Severity

# clock event (throttle) reason bits, nvml.h
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
_REASONS = {
    HW_SLOWDOWN: "HW slowdown",
    HW_THERMAL: "HW thermal slowdown",
    HW_POWER_BRAKE: "HW power brake slowdown",
    SW_THERMAL: "SW thermal slowdown",
}


class GpuCheck(Check):
    section = "gpu"

    def thresholds(self) -> dict[str, float]:
        """The node's hardware profile's GPU thresholds, with the site's overrides."""
        return self.ctx.expect().gpu

    # a GPU lost since this list was read fails its own reads: gpu.presence reports it
    DEVICE_LIST_MAX_AGE_S = 5.0

    def run(self) -> list[Finding]:
        due = self.begin()
        try:
            devs, lost = nvml.devices(self.DEVICE_LIST_MAX_AGE_S)
        except nvml.NvmlUnavailable:
            return []  # gpu.presence reports the driver problem once
        for gone in lost:
            self.forget(gone.index)
        out: list[Finding] = []
        for dev in devs:
            try:
                for sig in sorted(due):
                    self.keep(sig, dev.index, self.read(sig, dev))
            except pynvml.NVMLError_GPUIsLost:
                self.forget(dev.index)
                continue  # fell off the bus between calls: gpu.presence reports it
            except pynvml.NVMLError as exc:
                self.keep(
                    sig,
                    dev.index,
                    [
                        self.finding(
                            dev.component,
                            Severity.WARNING,
                            f"{self.code_prefix}.nvml_error",
                            f"{dev.label}: NVML error reading {self.name}: {exc}",
                            Action.INSPECT,
                            **dev.ids(),
                            nvml_error=exc.value,
                        )
                    ],
                )
            out.extend(self.kept(dev.index) or [self.ok(dev)])
        return out

    def read(self, signal: str, dev: Device) -> list[Finding]:
        raise NotImplementedError

    code_prefix = "gpu"

    def ok(self, dev: Device) -> Finding:
        return self.steady_ok(
            dev.component, f"{self.code_prefix}.ok", f"{dev.label}: ok", **dev.ids()
        )


class GpuPresenceCheck(Check):
    """Driver loads, every GPU answers, the count is what the node should have."""

    name = "gpu.presence"
    section = "gpu"
    interval_s = 30.0
    timeout_s = 10.0

    def run(self) -> list[Finding]:
        self.begin()  # one signal ("handles"), read on every run
        try:
            devs, lost = nvml.devices()
        except nvml.NvmlUnavailable as exc:
            code = {
                pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver.not_loaded",
                pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver.version_mismatch",
            }.get(exc.code or -1, "driver.init_failed")
            return [
                self.finding(
                    "host",
                    Severity.CRITICAL,
                    code,
                    f"NVIDIA driver unusable: {exc}",
                    Action.REBOOT if code == "driver.version_mismatch" else Action.INSPECT,
                    nvml_error=exc.code,
                )
            ]
        out: list[Finding] = []
        for gone in lost:
            out.append(
                self.finding(
                    f"gpu{gone.index}",
                    Severity.CRITICAL,
                    "gpu.lost",
                    f"GPU {gone.index} is lost / has fallen off the bus ({gone.error})",
                    Action.REBOOT,
                    index=gone.index,
                    nvml_error=gone.code,
                )
            )
        seen = len(devs) + len(lost)
        expected = self.ctx.expect().gpu_count
        if expected is not None and seen < expected:
            out.append(
                self.finding(
                    "host",
                    Severity.CRITICAL,
                    "gpu.count_low",
                    f"{seen} GPUs visible, {expected} expected",
                    Action.REBOOT,
                    visible=seen,
                    expected=expected,
                )
            )
        for d in devs:
            out.append(self.steady_ok(d.component, "gpu.present", f"{d.label}: present", **d.ids()))
        if not devs and not lost and expected is None:
            out.append(self.finding("host", Severity.OK, "gpu.none", "no NVIDIA GPUs on this node"))
        return out


class GpuMemoryCheck(GpuCheck):
    """ECC errors, retired pages and row remapping."""

    name = "gpu.memory"
    interval_s = 60.0
    code_prefix = "memory"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._dbe_volatile: dict[int, int] = {}

    def read(self, signal: str, dev: Device) -> list[Finding]:
        t = self.thresholds()
        h = dev.handle
        out: list[Finding] = []

        def f(sev: Severity, code: str, msg: str, action: Action, **details: Any) -> None:
            out.append(
                self.finding(
                    dev.component, sev, code, f"{dev.label}: {msg}", action, **dev.ids(), **details
                )
            )

        if signal == "dbe_volatile":
            dbe_v = call(
                pynvml.nvmlDeviceGetTotalEccErrors,
                h,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
            if dbe_v is not NOT_SUPPORTED:
                self._dbe_volatile[dev.index] = dbe_v
            if dbe_v is not NOT_SUPPORTED and dbe_v > t["dbe_volatile_max"]:
                f(
                    Severity.CRITICAL,
                    "ecc.dbe.volatile",
                    f"{dbe_v} volatile uncorrected ECC error{'s' if dbe_v != 1 else ''}",
                    Action.RESET_GPU,
                    count=dbe_v,
                )
        elif signal == "dbe_aggregate":
            dbe_a = call(
                pynvml.nvmlDeviceGetTotalEccErrors,
                h,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_AGGREGATE_ECC,
            )
            # history only matters when nothing is wrong now (a volatile DBE says more)
            fresh = self._dbe_volatile.get(dev.index, 0) <= t["dbe_volatile_max"]
            if dbe_a is not NOT_SUPPORTED and dbe_a > t["dbe_aggregate_max"] and fresh:
                f(
                    Severity.WARNING,
                    "ecc.dbe.aggregate",
                    f"{dbe_a} uncorrected ECC errors over the GPU's lifetime",
                    Action.WATCH,
                    count=dbe_a,
                )
        elif signal == "sbe_volatile":
            sbe_v = call(
                pynvml.nvmlDeviceGetTotalEccErrors,
                h,
                pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
            if sbe_v is not NOT_SUPPORTED and sbe_v > t["sbe_volatile_warn"]:
                f(
                    Severity.WARNING,
                    "ecc.sbe.volatile",
                    f"{sbe_v} volatile corrected ECC errors",
                    Action.WATCH,
                    count=sbe_v,
                )
        elif signal == "retired_pending":
            pending = call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
            if pending is not NOT_SUPPORTED and pending:
                f(
                    Severity.CRITICAL,
                    "retired_pages.pending",
                    "page retirement pending (needs a GPU reset)",
                    Action.RESET_GPU,
                )
        elif signal == "retired_pages":
            retired = 0
            for cause in (
                pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            ):
                pages = call(pynvml.nvmlDeviceGetRetiredPages, h, cause)
                if pages is not NOT_SUPPORTED:
                    retired += len(pages)
            if retired > t["retired_pages_max"]:
                f(
                    Severity.CRITICAL,
                    "retired_pages.limit",
                    f"{retired} retired pages (limit {int(t['retired_pages_max']) + 1})",
                    Action.INSPECT,
                    count=retired,
                )
        elif signal == "row_remap":
            rows = call(pynvml.nvmlDeviceGetRemappedRows, h)
            if rows is not NOT_SUPPORTED:
                corr, unc, rpending, failure = rows
                if failure:
                    f(
                        Severity.CRITICAL,
                        "row_remap.failed",
                        "row remapping failed: the GPU needs hardware inspection",
                        Action.INSPECT,
                        correctable=corr,
                        uncorrectable=unc,
                    )
                if rpending:
                    f(
                        Severity.CRITICAL,
                        "row_remap.pending",
                        "row remapping pending (needs a GPU reset)",
                        Action.RESET_GPU,
                        correctable=corr,
                        uncorrectable=unc,
                    )
                if unc > t["remap_uncorrectable_max"]:
                    f(
                        Severity.CRITICAL,
                        "row_remap.limit",
                        f"{unc} rows remapped for uncorrectable errors",
                        Action.INSPECT,
                        uncorrectable=unc,
                    )
        return out


class GpuNvlinkCheck(GpuCheck):
    """Every NVLink the board has is up; error counters do not climb."""

    name = "gpu.nvlink"
    interval_s = 60.0
    code_prefix = "nvlink"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._last: dict[tuple[str, int, int], int] = {}
        self._active: dict[int, list[int]] = {}  # active links per GPU, from the last state read

    def read(self, signal: str, dev: Device) -> list[Finding]:
        if signal == "state":
            return self._state(dev)
        if dev.index not in self._active:
            self._state(dev)
        return self._errors(dev)

    def _state(self, dev: Device) -> list[Finding]:
        t = self.thresholds()
        out: list[Finding] = []
        expected = int(t.get("expected_nvlinks", 0))
        active_links: list[int] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = call(pynvml.nvmlDeviceGetNvLinkState, dev.handle, link)
            except pynvml.NVMLError_InvalidArgument:
                break  # past the last link of this board
            if active is NOT_SUPPORTED:
                break
            if active:
                active_links.append(link)
                continue
            sev = Severity.CRITICAL if link < expected or not expected else Severity.WARNING
            out.append(
                self.finding(
                    f"nvlink:{dev.component}/{link}",
                    sev,
                    "nvlink.inactive",
                    f"{dev.label}: NVLink {link} is inactive",
                    Action.RESET_GPU,
                    link=link,
                    **dev.ids(),
                )
            )
        self._active[dev.index] = active_links
        return out

    def _errors(self, dev: Device) -> list[Finding]:
        t = self.thresholds()
        out: list[Finding] = []
        for link in self._active.get(dev.index, []):
            for counter in range(4):  # replay, recovery, CRC flit, CRC data
                v = call(pynvml.nvmlDeviceGetNvLinkErrorCounter, dev.handle, link, counter)
                if v is NOT_SUPPORTED:
                    continue
                key = (dev.uuid, link, counter)
                prev = self._last.get(key)
                self._last[key] = v
                if prev is not None and v - prev > t["nvlink_error_delta_warn"]:
                    out.append(
                        self.finding(
                            f"nvlink:{dev.component}/{link}",
                            Severity.WARNING,
                            "nvlink.errors",
                            f"{dev.label}: NVLink {link} error counter {counter} "
                            f"rose by {v - prev}",
                            Action.WATCH,
                            link=link,
                            counter=counter,
                            delta=v - prev,
                            **dev.ids(),
                        )
                    )
        return out


class GpuPcieCheck(GpuCheck):
    """PCIe link trained at full width (a x8 link halves host<->GPU bandwidth)."""

    name = "gpu.pcie"
    interval_s = 300.0
    code_prefix = "pcie"

    def read(self, signal: str, dev: Device) -> list[Finding]:
        t = self.thresholds()
        h = dev.handle
        out: list[Finding] = []
        if signal == "width":
            width = call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)
            width_max = call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)
            if (
                NOT_SUPPORTED not in (width, width_max)
                and width_max
                and (width < width_max * t["pcie_width_min_fraction"])
            ):
                out.append(
                    self.finding(
                        dev.component,
                        Severity.WARNING,
                        "pcie.width_degraded",
                        f"{dev.label}: PCIe link x{width} of x{width_max}",
                        Action.INSPECT,
                        width=width,
                        width_max=width_max,
                        **dev.ids(),
                    )
                )
        elif signal == "generation":
            gen = call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
            gen_max = call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h)
            if NOT_SUPPORTED not in (gen, gen_max) and gen < gen_max:
                # idle GPUs drop their PCIe generation to save power: informational only
                out.append(
                    self.finding(
                        dev.component,
                        Severity.INFO,
                        "pcie.gen_below_max",
                        f"{dev.label}: PCIe gen {gen} of {gen_max}",
                        Action.NONE,
                        gen=gen,
                        gen_max=gen_max,
                        **dev.ids(),
                    )
                )
        return out


class GpuThermalCheck(GpuCheck):
    """Temperature against the board's slowdown/shutdown thresholds; HW clock slowdowns."""

    name = "gpu.thermal"
    interval_s = 30.0
    code_prefix = "thermal"

    def read(self, signal: str, dev: Device) -> list[Finding]:
        t = self.thresholds()
        h = dev.handle
        out: list[Finding] = []
        util = call(pynvml.nvmlDeviceGetUtilizationRates, h)
        if util is not NOT_SUPPORTED:
            # shipped with reports: hang detection asks whether a job's GPUs sit idle
            gpu_util = self.metrics.setdefault("gpu_util", {})
            assert isinstance(gpu_util, dict)
            gpu_util[str(dev.index)] = int(util.gpu)
        temp = call(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
        slow = call(
            pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        )
        shut = call(
            pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
        )
        if temp is not NOT_SUPPORTED:
            if shut is not NOT_SUPPORTED and temp >= shut:
                out.append(
                    self.finding(
                        dev.component,
                        Severity.CRITICAL,
                        "thermal.shutdown",
                        f"{dev.label}: {temp} C, at/above shutdown threshold {shut} C",
                        Action.DRAIN,
                        temp_c=temp,
                        shutdown_c=shut,
                        **dev.ids(),
                    )
                )
            elif slow is not NOT_SUPPORTED and temp >= slow - t["temp_warn_margin_c"]:
                out.append(
                    self.finding(
                        dev.component,
                        Severity.WARNING,
                        "thermal.slowdown",
                        f"{dev.label}: {temp} C, near slowdown threshold {slow} C",
                        Action.WATCH,
                        temp_c=temp,
                        slowdown_c=slow,
                        **dev.ids(),
                    )
                )
        reasons = call(pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
        if reasons is not NOT_SUPPORTED and reasons:
            hw = [name for bit, name in _REASONS.items() if reasons & bit and bit != SW_THERMAL]
            if hw:
                out.append(
                    self.finding(
                        dev.component,
                        Severity.WARNING,
                        "clocks.hw_slowdown",
                        f"{dev.label}: clocks held down: {', '.join(hw)}",
                        Action.WATCH,
                        reasons=hex(reasons),
                        **dev.ids(),
                    )
                )
            elif reasons & SW_THERMAL:
                out.append(
                    self.finding(
                        dev.component,
                        Severity.INFO,
                        "clocks.sw_thermal",
                        f"{dev.label}: software thermal slowdown",
                        Action.NONE,
                        reasons=hex(reasons),
                        **dev.ids(),
                    )
                )
        return out
