"""NVML critical-error events: one thread per agent blocked in nvmlEventSetWait_v2, each event
a finding at once (XIDs through the catalog, ECC and recovery-action events by their own table)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from babysitter.checks import nvml
from babysitter.checks.base import EventSource
from babysitter.checks.nvml import nv
from babysitter.checks.xid.finding import xid_finding
from babysitter.finding import Action, Finding, Severity
from babysitter.hardware.recovery import RecoveryAction
from babysitter.hardware.xids import job_attributable

if TYPE_CHECKING:
    import logging

    from tenacity import RetryCallState


def _log() -> logging.Logger:
    # imported when there is something to say: `babysitter check` imports this module, and
    # logging's import is a few percent of its whole memory budget
    import logging

    return logging.getLogger(__name__)


# NVML event types that signal a fault (nvml.h), and what each becomes. XIDs go through the
# catalog; single-bit ECC events are rate-based (a few are normal). Anything else in the mask
# (PState, clock, power source, MIG changes) is not a fault and is not registered.
EVENT_XID = 0x8
EVENT_SBE = 0x1
EVENT_FINDINGS: dict[int, tuple[str, Severity, Action, str]] = {
    0x2: ("ecc.dbe.event", Severity.CRITICAL, Action.RESET_GPU, "uncorrectable (double-bit) ECC"),
    0x200: ("ecc.sbe.storm", Severity.WARNING, Action.WATCH, "corrected ECC error storm"),
    0x400: ("retirement.event", Severity.WARNING, Action.WATCH, "memory page/row retired"),
    0x800: ("retirement.failed", Severity.CRITICAL, Action.INSPECT, "memory retirement failed"),
    0x1000: ("poison.nonfatal", Severity.WARNING, Action.WATCH, "non-fatal poison error"),
    0x2000: ("poison.fatal", Severity.CRITICAL, Action.RESET_GPU, "fatal poison error"),
    0x4000: ("gpu.unavailable", Severity.CRITICAL, Action.REBOOT, "GPU unavailable"),
    # a known action takes its own code and rung (hardware/recovery.py); an unknown one: inspect
    0x8000: ("gpu.recovery_action", Severity.CRITICAL, Action.INSPECT, "recovery required"),
}
FAULT_EVENTS = EVENT_XID | EVENT_SBE | sum(EVENT_FINDINGS)
EVENT_RECOVERY_ACTION = 0x8000  # eventData: the new nvmlDeviceGpuRecoveryAction_t
XID_RECOVERY_ACTION_CHANGED = 154
SBE_WINDOW_S = 3600.0


# Starting the event source again after a failure (driver not loaded yet at boot, a version
# mismatch during a driver upgrade): first retry after RETRY_FIRST_S, doubling up to RETRY_MAX_S.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 300.0


class _NoGpus(Exception):
    pass


class NvmlEvents(EventSource):
    """One thread blocked in nvmlEventSetWait_v2, registered on every GPU for every fault event
    type that GPU supports (NOT_SUPPORTED on a board is normal: the fast tier still polls the
    same signal). Each event becomes findings at once. When the source cannot start, it says so
    (a degraded-agent warning in every report) and retries with backoff until it runs."""

    name = "nvml.events"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registered: dict[int, int] = {}  # GPU index -> event mask registered
        self._sbe: dict[int, list[float]] = {}

    def supported(self) -> bool:
        """False only where there is no NVML library at all (a CPU node); a driver that does
        not answer yet is a reason to start and retry, not to never listen."""
        try:
            nvml.init()
        except nvml.NvmlUnavailable as exc:
            return exc.code is not None
        return True

    def start(self, emit: Callable[[list[Finding]], None]) -> None:
        self._thread = threading.Thread(
            target=self._loop, args=(emit,), name="nvml-events", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=0.2)

    def _register(self, es: Any, dev: nvml.Device) -> int:
        supported = nvml.call(nv.nvmlDeviceGetSupportedEventTypes, dev.handle)
        if supported is nvml.NOT_SUPPORTED:
            return 0
        mask = int(supported) & FAULT_EVENTS
        if not mask:
            return 0
        try:
            if nvml.call(nv.nvmlDeviceRegisterEvents, dev.handle, mask, es) is None:
                return mask
        except nv.NVMLError:
            pass
        got = 0  # some boards refuse a combined mask: one type at a time
        for bit in (1 << i for i in range(mask.bit_length())):
            if mask & bit:
                try:
                    if nvml.call(nv.nvmlDeviceRegisterEvents, dev.handle, bit, es) is None:
                        got |= bit
                except nv.NVMLError:
                    continue
        return got

    def finding_for(self, ev_type: int, data: int, dev: nvml.Device | None, idx: int) -> Any:
        comp = f"gpu{idx}" if idx >= 0 else "host"
        where = dev.label if dev else f"GPU {idx}"
        ids = dev.ids() if dev else {}
        if ev_type == EVENT_XID:
            overrides = self.ctx.config.checks.xid.overrides
            # XID 154 carries no text here: the action it announces is read from the GPU now
            recovery = self._recovery_now(dev) if data == XID_RECOVERY_ACTION_CHANGED else None
            # an XID the application caused (45, 13, ...): not kept until a reboot (sticky.py);
            # the kernel log's copy, which names its job, ends with that job (xid.kmsg)
            job = {"job_attributable": True} if job_attributable(data) else {}
            return xid_finding(
                "xid.nvml",
                data,
                overrides,
                comp,
                where,
                "",
                recovery,
                source="nvml-event",
                **job,
                **ids,
            )
        if ev_type == EVENT_SBE:
            now = time.monotonic()
            times = [t for t in self._sbe.get(idx, []) if now - t <= SBE_WINDOW_S] + [now]
            self._sbe[idx] = times
            limit = self.ctx.config.checks.xid.sbe_events_per_hour_warn
            if len(times) < limit:
                return None
            return Finding(
                check="gpu.events",
                component=comp,
                severity=Severity.WARNING,
                code="ecc.sbe.rate",
                message=f"{where}: {len(times)} corrected ECC events in the last hour",
                action=Action.WATCH,
                details={"events": len(times), "event_type": hex(ev_type), **ids},
            )
        code, sev, action, what = EVENT_FINDINGS.get(
            ev_type, ("event.unknown", Severity.WARNING, Action.INSPECT, "unknown NVML event")
        )
        extra: dict[str, Any] = {}
        if ev_type == EVENT_RECOVERY_ACTION:
            try:
                rec = RecoveryAction(data)
            except ValueError:
                rec = None  # a value this table does not know: inspect (the default above)
            if rec is RecoveryAction.NONE:
                return None  # "no recovery needed"
            if rec is not None:
                code, sev, action, what = rec.code, rec.severity, rec.action, rec.reason
                extra["recovery_action"] = int(rec)
        return Finding(
            check="gpu.events",
            component=comp,
            severity=sev,
            code=code,
            message=f"{where}: {what} (NVML event {ev_type:#x}, data {data})",
            action=action,
            details={
                "event_type": hex(ev_type),
                "event_data": data,
                "source": "nvml-event",
                **extra,
                **ids,
            },
        )

    @staticmethod
    def _recovery_now(dev: nvml.Device | None) -> RecoveryAction | None:
        """The GPU's recovery action, read at once (None: not read; the XID stays unknown)."""
        if dev is None:
            return None
        from babysitter.checks.gpu.recovery import read_recovery_action

        try:
            return read_recovery_action(dev.handle).action
        except nv.NVMLError:
            return None

    def _open(self) -> tuple[Any, dict[int, nvml.Device]]:
        """The event set, registered on every GPU; raises when NVML cannot give one."""
        devs, _ = nvml.devices()
        if not devs:
            raise _NoGpus("NVML lists no GPU")
        es = nv.nvmlEventSetCreate()
        by_index = {}
        for d in devs:
            try:
                self.registered[d.index] = self._register(es, d)
                by_index[d.index] = d
            except nv.NVMLError as exc:
                _log().warning("cannot register NVML events on %s: %s", d.label, exc)
        return es, by_index

    def _degraded(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        _log().warning(
            "NVML event source not started (attempt %d), retrying in %.0f s: %s",
            state.attempt_number,
            wait,
            exc,
        )
        self.set_health(
            [
                Finding(
                    check=self.name,
                    component="host",
                    severity=Severity.WARNING,
                    code="agent.degraded",
                    message=(
                        f"NVML event source not running (attempt {state.attempt_number}, next "
                        f"in {wait:.0f} s): {exc}; XIDs and ECC events are seen only by polling"
                    )[:2000],
                    action=Action.INSPECT,
                    details={"attempt": state.attempt_number, "error": str(exc)[:500]},
                )
            ]
        )

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _start_with_retry(self) -> tuple[Any, dict[int, nvml.Device]] | None:
        # the agent's event thread only: `babysitter check` never pays for tenacity's import
        from tenacity import (
            Retrying,
            retry_if_exception_type,
            stop_when_event_set,
            wait_exponential,
        )

        retrying = Retrying(
            retry=retry_if_exception_type((nv.NVMLError, nvml.NvmlUnavailable, _NoGpus)),
            wait=wait_exponential(multiplier=RETRY_FIRST_S, max=RETRY_MAX_S),
            stop=stop_when_event_set(self._stop),
            sleep=self._pause,  # stop() interrupts the backoff
            before_sleep=self._degraded,
            reraise=True,
        )
        try:
            return retrying(self._open)
        except (nv.NVMLError, nvml.NvmlUnavailable, _NoGpus):
            return None  # stopped while retrying

    def _loop(self, emit: Callable[[list[Finding]], None]) -> None:
        opened = self._start_with_retry()
        if opened is None:
            return
        es, by_index = opened
        self.set_health(
            [
                Finding(
                    check=self.name,
                    component="host",
                    severity=Severity.OK,
                    code="events.running",
                    message=f"NVML events registered on {len(by_index)} GPUs",
                )
            ]
        )
        while not self._stop.is_set():
            try:
                # the thread costs nothing while blocked (a daemon thread: stop() does not
                # wait out the timeout)
                ev = nv.nvmlEventSetWait_v2(es, 5000)
            except nv.NVMLError_Timeout:
                continue
            except nv.NVMLError as exc:
                if isinstance(exc, nv.NVMLError_GpuIsLost):
                    emit(
                        [
                            Finding(
                                check="gpu.presence",
                                component="host",
                                severity=Severity.CRITICAL,
                                code="gpu.lost",
                                message=f"a GPU was lost while waiting for events: {exc}",
                                action=Action.REBOOT,
                            )
                        ]
                    )
                self._stop.wait(1)
                continue
            try:
                idx = nv.nvmlDeviceGetIndex(ev.device)
            except nv.NVMLError:
                idx = -1
            f = self.finding_for(int(ev.eventType), int(ev.eventData), by_index.get(idx), idx)
            if f is not None:
                emit([f])
        try:
            nv.nvmlEventSetFree(es)
        except nv.NVMLError:
            pass


NvmlXidEvents = NvmlEvents  # the older name
