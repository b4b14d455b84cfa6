"""GPU checks through NVML (nvidia-ml-py): presence/lost, memory (ECC, retired pages, row
remapping), NVLink, PCIe (width, generation, replays) and thermals/clock-event reasons.

Every healthy GPU gets an `ok` finding so the controller sees the fault is gone. A lost GPU is
reported by `gpu.presence` only; the other checks skip it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from babysitter.checks import nvml
from babysitter.checks.base import Check
from babysitter.checks.gpu.settings import GpuThresholds
from babysitter.checks.gpu.tiers import SIGNALS
from babysitter.checks.nvml import NOT_SUPPORTED, Device, call, nv
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

    def thresholds(self) -> GpuThresholds:
        """`[checks.gpu.thresholds]`: the defaults with the site's overrides."""
        return self.ctx.config.checks.gpu.thresholds

    def expected_nvlinks(self) -> int:
        """NVLinks each GPU must have up: the site's threshold, else the hardware profile's."""
        t = self.thresholds().expected_nvlinks
        return self.ctx.expect().nvlinks if t is None else t

    # a GPU lost since this list was read fails its own reads: gpu.presence reports it
    DEVICE_LIST_MAX_AGE_S = 5.0

    def run(self) -> list[Finding]:
        begun = self.begin()
        # the tiers table's order: a signal may use what an earlier one read in the same run
        due = [s for s in self.signal_intervals() if s in begun]
        try:
            devs, lost = nvml.devices(self.DEVICE_LIST_MAX_AGE_S)
        except nvml.NvmlUnavailable:
            return []  # gpu.presence reports the driver problem once
        for gone in lost:
            self.forget(gone.index)
        out: list[Finding] = []
        for dev in devs:
            if self._read_due(dev, due):
                out.extend(self.kept(dev.index) or [self.ok(dev)])
        return out

    def _read_due(self, dev: Device, due: list[str]) -> bool:
        """Read one GPU's due signals and keep what each found; False when the GPU fell off the
        bus meanwhile (gpu.presence reports that). An NVML error ends this GPU's reads for the
        run and stands for the signal that failed."""
        for sig in due:
            try:
                self.keep(sig, dev.index, self.read(sig, dev))
            except nv.NVMLError_GpuIsLost:
                self.forget(dev.index)
                return False
            except nv.NVMLError as exc:
                self.keep(sig, dev.index, [self._nvml_error(dev, exc)])
                break
        return True

    def _nvml_error(self, dev: Device, exc: nv.NVMLError) -> Finding:
        return self.finding(
            dev.component,
            Severity.WARNING,
            f"{self.code_prefix}.nvml_error",
            f"{dev.label}: NVML error reading {self.name}: {exc}",
            Action.INSPECT,
            **dev.ids(),
            nvml_error=exc.value,
        )

    def problem(
        self, dev: Device, sev: Severity, code: str, msg: str, action: Action, **details: Any
    ) -> Finding:
        """A finding on one GPU: its label leads the message, its ids are in the details."""
        return self.finding(
            dev.component, sev, code, f"{dev.label}: {msg}", action, **dev.ids(), **details
        )

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
    signals = SIGNALS["gpu.presence"]
    section = "gpu"
    interval_s = 30.0
    timeout_s = 10.0

    def run(self) -> list[Finding]:
        self.begin()  # one signal ("handles"), read on every run
        try:
            devs, lost = nvml.devices()
        except nvml.NvmlUnavailable as exc:
            code = {
                nv.NVML_ERROR_DRIVER_NOT_LOADED: "driver.not_loaded",
                nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver.version_mismatch",
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
    signals = SIGNALS["gpu.memory"]
    interval_s = 60.0
    code_prefix = "memory"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._dbe_volatile_seen: dict[int, int] = {}  # last volatile DBE count per GPU
        # one reader per signal of the tier table (tiers.py)
        self._readers: dict[str, Callable[[Device, GpuThresholds], list[Finding]]] = {
            "dbe_volatile": self._dbe_volatile,
            "dbe_aggregate": self._dbe_aggregate,
            "sbe_volatile": self._sbe_volatile,
            "retired_pending": self._retired_pending,
            "retired_pages": self._retired_pages,
            "row_remap": self._row_remap,
        }

    def read(self, signal: str, dev: Device) -> list[Finding]:
        return self._readers[signal](dev, self.thresholds())

    def _dbe_volatile(self, dev: Device, t: GpuThresholds) -> list[Finding]:
        dbe = _ecc_errors(dev, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        if dbe is None:
            return []
        self._dbe_volatile_seen[dev.index] = dbe
        if dbe <= t.dbe_volatile_max:
            return []
        msg = f"{dbe} volatile uncorrected ECC error{'s' if dbe != 1 else ''}"
        return [
            self.problem(
                dev, Severity.CRITICAL, "ecc.dbe.volatile", msg, Action.RESET_GPU, count=dbe
            )
        ]

    def _dbe_aggregate(self, dev: Device, t: GpuThresholds) -> list[Finding]:
        dbe = _ecc_errors(dev, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC)
        # history only matters when nothing is wrong now (a volatile DBE says more)
        fresh = self._dbe_volatile_seen.get(dev.index, 0) <= t.dbe_volatile_max
        if dbe is None or dbe <= t.dbe_aggregate_max or not fresh:
            return []
        msg = f"{dbe} uncorrected ECC errors over the GPU's lifetime"
        return [
            self.problem(dev, Severity.WARNING, "ecc.dbe.aggregate", msg, Action.WATCH, count=dbe)
        ]

    def _sbe_volatile(self, dev: Device, t: GpuThresholds) -> list[Finding]:
        sbe = _ecc_errors(dev, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
        if sbe is None or sbe <= t.sbe_volatile_warn:
            return []
        msg = f"{sbe} volatile corrected ECC errors"
        return [
            self.problem(dev, Severity.WARNING, "ecc.sbe.volatile", msg, Action.WATCH, count=sbe)
        ]

    def _retired_pending(self, dev: Device, t: GpuThresholds) -> list[Finding]:
        pending = call(nv.nvmlDeviceGetRetiredPagesPendingStatus, dev.handle)
        if pending is NOT_SUPPORTED or not pending:
            return []
        msg = "page retirement pending (needs a GPU reset)"
        return [
            self.problem(dev, Severity.CRITICAL, "retired_pages.pending", msg, Action.RESET_GPU)
        ]

    def _retired_pages(self, dev: Device, t: GpuThresholds) -> list[Finding]:
        retired = 0
        for cause in (
            nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        ):
            pages = call(nv.nvmlDeviceGetRetiredPages, dev.handle, cause)
            if pages is not NOT_SUPPORTED:
                retired += len(pages)
        if retired <= t.retired_pages_max:
            return []
        msg = f"{retired} retired pages (limit {t.retired_pages_max + 1})"
        return [
            self.problem(
                dev, Severity.CRITICAL, "retired_pages.limit", msg, Action.INSPECT, count=retired
            )
        ]

    def _row_remap(self, dev: Device, t: GpuThresholds) -> list[Finding]:
        rows = call(nv.nvmlDeviceGetRemappedRows, dev.handle)
        if rows is NOT_SUPPORTED:
            return []
        corr, unc, pending, failure = rows
        out: list[Finding] = []
        counts = {"correctable": corr, "uncorrectable": unc}
        if failure:
            msg = "row remapping failed: the GPU needs hardware inspection"
            out.append(
                self.problem(
                    dev, Severity.CRITICAL, "row_remap.failed", msg, Action.INSPECT, **counts
                )
            )
        if pending:
            msg = "row remapping pending (needs a GPU reset)"
            out.append(
                self.problem(
                    dev, Severity.CRITICAL, "row_remap.pending", msg, Action.RESET_GPU, **counts
                )
            )
        if unc > t.remap_uncorrectable_max:
            msg = f"{unc} rows remapped for uncorrectable errors"
            out.append(
                self.problem(
                    dev,
                    Severity.CRITICAL,
                    "row_remap.limit",
                    msg,
                    Action.INSPECT,
                    uncorrectable=unc,
                )
            )
        return out


def _ecc_errors(dev: Device, error_type: int, counter: int) -> int | None:
    """One total-ECC-error counter of a GPU (None: the board does not count it)."""
    v = call(nv.nvmlDeviceGetTotalEccErrors, dev.handle, error_type, counter)
    return None if v is NOT_SUPPORTED else int(v)


class GpuNvlinkCheck(GpuCheck):
    """Every NVLink the board has is up; error counters do not climb.

    Link state is one batched `nvmlDeviceGetFieldValues` per GPU (the link-count field once,
    then the state field for every link), cheap enough for the fast tier, so a link that goes
    down drains in about a second. Drivers without the state field (before r550) answer
    NOT_SUPPORTED per field; then the per-link scan (one call per link) reports instead, on its
    slower interval."""

    name = "gpu.nvlink"
    signals = SIGNALS["gpu.nvlink"]
    interval_s = 60.0
    code_prefix = "nvlink"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._last: dict[tuple[str, int, int], int] = {}
        self._active: dict[int, list[int]] = {}  # active links per GPU, from the last state read
        self._links: dict[int, int] = {}  # link count per GPU (from the link-count field)
        self._fields: dict[int, bool] = {}  # per GPU: the driver answers the state field
        self._state_ids: dict[int, list[tuple[int, int]]] = {}  # the state fields, per link count

    def read(self, signal: str, dev: Device) -> list[Finding]:
        if signal == "state":
            return self._state_fields(dev)
        if signal == "per_link_state":
            if dev.index not in self._fields:
                self._state_fields(dev)  # learn whether the driver has the state field
            # the batched read covers the links; scanning them one by one again is wasted calls
            return [] if self._fields.get(dev.index) else self._state_scan(dev)
        if dev.index not in self._active:
            self._state_fields(dev)
            if not self._fields.get(dev.index):
                self._state_scan(dev)
        return self._errors(dev)

    def _state_fields(self, dev: Device) -> list[Finding]:
        """Every link's state in one driver call; [] (and the scan takes over) when the driver
        has no such field."""
        if not self._fields.get(dev.index, True):
            return []
        links = self._links.get(dev.index)
        if links is None:
            count = self._field_values(dev, [(nv.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)])
            if count is None:
                return []
            links = self._links[dev.index] = min(count[0], nv.NVML_NVLINK_MAX_LINKS)
        ids = self._state_ids.get(links)
        if ids is None:
            ids = self._state_ids[links] = [
                (nv.NVML_FI_DEV_NVLINK_GET_STATE, link) for link in range(links)
            ]
        states = self._field_values(dev, ids)
        if states is None:
            return []
        self._fields[dev.index] = True
        inactive = nv.NVML_NVLINK_STATE_INACTIVE
        self._active[dev.index] = [link for link, st in enumerate(states) if st != inactive]
        if all(st == 1 for st in states):  # NVML_NVLINK_STATE_ACTIVE: the common case
            return []
        out: list[Finding] = []
        for link, st in enumerate(states):
            if st == inactive:
                out.append(self._inactive(dev, link))
            elif st != 1:
                out.extend(self._other_state(dev, link, st))
        return out

    def _other_state(self, dev: Device, link: int, state: int) -> list[Finding]:
        """A link neither ACTIVE nor INACTIVE, judged explicitly (docs/checks.md, "NVLink
        states"): SLEEP is up (a low-power link on an idle GPU wakes on traffic);
        ACTIVE_TRAFFIC_DISABLED carries nothing: less bandwidth, a warning for a human; a state
        babysitter does not know is never healthy."""
        if state == nv.NVML_NVLINK_STATE_SLEEP:
            return []
        if state == nv.NVML_NVLINK_STATE_ACTIVE_TRAFFIC_DISABLED:
            code, msg = "nvlink.traffic_disabled", f"NVLink {link} is up with traffic disabled"
        else:
            code, msg = "nvlink.state_unknown", f"NVLink {link} in state {state}, unknown"
        return [
            self.finding(
                f"nvlink:{dev.component}/{link}",
                Severity.WARNING,
                code,
                f"{dev.label}: {msg}",
                Action.INSPECT,
                link=link,
                state=state,
                **dev.ids(),
            )
        ]

    def _field_values(self, dev: Device, ids: list[tuple[int, int]]) -> list[int] | None:
        """Unsigned values of `ids` (field, scope) in one call; None, remembered, when the driver
        does not answer every one of them."""
        if not ids:
            return []
        try:
            values = call(nv.nvmlDeviceGetFieldValues, dev.handle, ids)
        except nv.NVMLError_FunctionNotFound:  # a driver older than the call itself
            values = NOT_SUPPORTED
        out: list[int] = []
        if values is not NOT_SUPPORTED:
            success = nv.NVML_SUCCESS
            for v in values:  # one pass: each field read of pynvml's structs is a Python call
                if v.nvmlReturn != success:
                    break
                out.append(int(v.value.uiVal))
            else:
                return out
        self._fields[dev.index] = False
        return None

    def _state_scan(self, dev: Device) -> list[Finding]:
        """One state call per link, until the board says there are no more links."""
        out: list[Finding] = []
        active_links: list[int] = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                active = call(nv.nvmlDeviceGetNvLinkState, dev.handle, link)
            except nv.NVMLError_InvalidArgument:
                break  # past the last link of this board
            if active is NOT_SUPPORTED:
                break
            if active:
                active_links.append(link)
            else:
                out.append(self._inactive(dev, link))
        self._active[dev.index] = active_links
        return out

    def _inactive(self, dev: Device, link: int) -> Finding:
        expected = self.expected_nvlinks()
        sev = Severity.CRITICAL if link < expected or not expected else Severity.WARNING
        return self.finding(
            f"nvlink:{dev.component}/{link}",
            sev,
            "nvlink.inactive",
            f"{dev.label}: NVLink {link} is inactive",
            Action.RESET_GPU,
            link=link,
            **dev.ids(),
        )

    def _errors(self, dev: Device) -> list[Finding]:
        t = self.thresholds()
        out: list[Finding] = []
        for link in self._active.get(dev.index, []):
            for counter in range(4):  # replay, recovery, CRC flit, CRC data
                v = call(nv.nvmlDeviceGetNvLinkErrorCounter, dev.handle, link, counter)
                if v is NOT_SUPPORTED:
                    continue
                key = (dev.uuid, link, counter)
                prev = self._last.get(key)
                self._last[key] = v
                if prev is not None and v - prev > t.nvlink_error_delta_warn:
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
    """PCIe link trained at full width (a x8 link halves host<->GPU bandwidth); replays (link
    retransmissions) not climbing."""

    name = "gpu.pcie"
    signals = SIGNALS["gpu.pcie"]
    interval_s = 300.0
    code_prefix = "pcie"
    # NVML_FI_DEV_PCIE_REPLAY_COUNTER (nvml.h), read with nvmlDeviceGetFieldValues
    PCIE_REPLAY_COUNTER = 94
    clock = staticmethod(time.monotonic)

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._replays_seen: dict[str, tuple[float, int]] = {}  # per GPU: (when, replay count)

    def read(self, signal: str, dev: Device) -> list[Finding]:
        t = self.thresholds()
        h = dev.handle
        out: list[Finding] = []
        if signal == "replays":
            out += self._replays(dev, t)
        elif signal == "width":
            width = call(nv.nvmlDeviceGetCurrPcieLinkWidth, h)
            width_max = call(nv.nvmlDeviceGetMaxPcieLinkWidth, h)
            if (
                NOT_SUPPORTED not in (width, width_max)
                and width_max
                and (width < width_max * t.pcie_width_min_fraction)
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
            gen = call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
            gen_max = call(nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
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

    def _replays(self, dev: Device, t: GpuThresholds) -> list[Finding]:
        """Replays per minute since the last read: a marginal link (riser, slot, retimer)
        retransmits long before it trains narrower; DCGM warns above 8 a minute. The first read
        of a GPU is only the baseline (a one-shot run never warns); a counter that went down was
        reset with the driver and starts a new baseline."""
        try:
            values = call(nv.nvmlDeviceGetFieldValues, dev.handle, [(self.PCIE_REPLAY_COUNTER, 0)])
        except nv.NVMLError_FunctionNotFound:  # a driver older than the call itself
            return []
        if values is NOT_SUPPORTED or values[0].nvmlReturn != nv.NVML_SUCCESS:
            return []
        count, now = _field_int(values[0]), self.clock()
        prev = self._replays_seen.get(dev.uuid)
        self._replays_seen[dev.uuid] = (now, count)
        if prev is None or count < prev[1] or now <= prev[0]:
            return []
        per_min = (count - prev[1]) * 60.0 / (now - prev[0])
        if per_min <= t.pcie_replays_per_min_warn:
            return []
        msg = (
            f"{per_min:.0f} PCIe replays a minute (warning above "
            f"{t.pcie_replays_per_min_warn:g}): a marginal link"
        )
        return [
            self.problem(
                dev,
                Severity.WARNING,
                "pcie.replays",
                msg,
                Action.INSPECT,
                replays=count - prev[1],
                per_min=round(per_min, 1),
            )
        ]


# nvmlValueType_t -> the member of nvmlValue_t holding the number
_VALUE_MEMBER = {1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _field_int(v: Any) -> int:
    """A field value's number, by its type: a counter comes as 32 or 64 bits."""
    return int(getattr(v.value, _VALUE_MEMBER.get(int(v.valueType), "ullVal")))


class GpuThermalCheck(GpuCheck):
    """Temperature against the board's slowdown/shutdown thresholds; HW clock slowdowns."""

    name = "gpu.thermal"
    signals = SIGNALS["gpu.thermal"]
    interval_s = 30.0
    code_prefix = "thermal"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        # (shutdown, slowdown) threshold per GPU, by (index, UUID): the board's own limits
        # (VBIOS), fixed for the board while the driver runs (NVML sets only the acoustic and
        # GPU-max ones), so read once per board, not twice per fast-tier read; a reset or a
        # lost GPU reads them anew, and a new board has a new UUID
        self._limits: dict[tuple[int, str], tuple[Any, Any]] = {}

    def read(self, signal: str, dev: Device) -> list[Finding]:
        self._utilisation(dev)
        return self._temperature(dev, self.thresholds()) + self._clock_events(dev)

    def forget(self, key: object) -> None:
        super().forget(key)
        self._limits = {k: v for k, v in self._limits.items() if k[0] != key}

    def gpu_was_reset(self, gpu: int, before: float) -> None:
        self._limits = {k: v for k, v in self._limits.items() if k[0] != gpu}

    def _limits_of(self, dev: Device) -> tuple[Any, Any]:
        """The GPU's shutdown and slowdown thresholds (NOT_SUPPORTED where it has none)."""
        key = (dev.index, dev.uuid)
        limits = self._limits.get(key)
        if limits is None:
            h = dev.handle
            shut = call(
                nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
            )
            slow = call(
                nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            )
            limits = self._limits[key] = (shut, slow)
        return limits

    def _utilisation(self, dev: Device) -> None:
        """Shipped with reports: hang detection asks whether a job's GPUs sit idle."""
        util = call(nv.nvmlDeviceGetUtilizationRates, dev.handle)
        if util is not NOT_SUPPORTED:
            gpu_util = self.metrics.setdefault("gpu_util", {})
            assert isinstance(gpu_util, dict)
            gpu_util[str(dev.index)] = int(util.gpu)

    def _temperature(self, dev: Device, t: GpuThresholds) -> list[Finding]:
        h = dev.handle
        temp = call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        if temp is NOT_SUPPORTED:
            return []
        shut, slow = self._limits_of(dev)
        if shut is not NOT_SUPPORTED and temp >= shut:
            msg = f"{temp} C, at/above shutdown threshold {shut} C"
            return [
                self.problem(
                    dev,
                    Severity.CRITICAL,
                    "thermal.shutdown",
                    msg,
                    Action.DRAIN,
                    temp_c=temp,
                    shutdown_c=shut,
                )
            ]
        if slow is not NOT_SUPPORTED and temp >= slow - t.temp_warn_margin_c:
            msg = f"{temp} C, near slowdown threshold {slow} C"
            return [
                self.problem(
                    dev,
                    Severity.WARNING,
                    "thermal.slowdown",
                    msg,
                    Action.WATCH,
                    temp_c=temp,
                    slowdown_c=slow,
                )
            ]
        return []

    def _clock_events(self, dev: Device) -> list[Finding]:
        reasons = call(nv.nvmlDeviceGetCurrentClocksEventReasons, dev.handle)
        if reasons is NOT_SUPPORTED or not reasons:
            return []
        hw = [name for bit, name in _REASONS.items() if reasons & bit and bit != SW_THERMAL]
        if hw:
            msg = f"clocks held down: {', '.join(hw)}"
            return [
                self.problem(
                    dev,
                    Severity.WARNING,
                    "clocks.hw_slowdown",
                    msg,
                    Action.WATCH,
                    reasons=hex(reasons),
                )
            ]
        if reasons & SW_THERMAL:
            msg = "software thermal slowdown"
            return [
                self.problem(
                    dev, Severity.INFO, "clocks.sw_thermal", msg, Action.NONE, reasons=hex(reasons)
                )
            ]
        return []
