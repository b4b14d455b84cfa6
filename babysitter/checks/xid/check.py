"""XIDs, two ways: NVML critical-error events (one waiting thread per agent) and the kernel log
(`NVRM: Xid (PCI:0000:3b:00): 79, pid=…` and `GPU has fallen off the bus`)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from babysitter.checks import nvml
from babysitter.checks.base import Check, EventSource
from babysitter.checks.nvml import nv
from babysitter.finding import Action, Finding, Severity
from babysitter.hardware.recovery import RecoveryAction
from babysitter.hardware.xids import XidClass, classify

if TYPE_CHECKING:
    import logging

    from tenacity import RetryCallState


def _log() -> logging.Logger:
    # imported when there is something to say: `babysitter check` imports this module, and
    # logging's import is a few percent of its whole memory budget
    import logging

    return logging.getLogger(__name__)


# ASCII digits only (`\d` also matches e.g. Arabic-Indic digits, which int() would read as an
# XID) and a bounded number: real XIDs have at most three digits; a longer one is not an XID line
XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]{1,32})\): ([0-9]{1,6})(?![0-9])(?:, (.*))?")
OFF_BUS_RE = re.compile(r"NVRM: GPU at PCI:([0-9A-Fa-f:.]{1,32}): GPU has fallen off the bus")
MAX_LINE = 4096


def _norm_pci(pci: str) -> str:
    """'0000:3b:00' / '00000000:3B:00.0' -> '3b:00' (bus:device) for matching."""
    parts = pci.lower().split(":")
    if len(parts) >= 2:
        return f"{parts[-2][-2:]}:{parts[-1].split('.')[0][:2]}"
    return pci.lower()


def xid_finding(
    check: str,
    xid: int,
    overrides: dict[int, XidClass],
    component: str,
    where: str,
    extra: str = "",
    recovery: RecoveryAction | None = None,
    **details: Any,
) -> Finding:
    """The finding of one XID. `recovery`: for XID 154 without its kernel-log text (an NVML
    event), the driver's recovery action read at once from the GPU; the text's, where there is
    one, is the action this XID announced."""
    v = classify(xid, overrides, extra)
    if v.klass == "recovery" and v.recovery is None and recovery is not None:
        v = msgspec.structs.replace(
            v,
            severity=recovery.severity,
            action=recovery.action,
            rule=f"catalog: xid {xid} -> driver recovery action {recovery.label} (read)",
            recovery=recovery,
        )
    node_fault = v.klass in ("reboot", "reset_gpu")
    if v.recovery is not None:
        what = f"driver recovery action: {v.recovery.reason}"
    elif v.klass == "recovery":
        what = "driver recovery action unknown: drained until gpu.recovery reads it"
    elif node_fault:
        what = "node fault"
    else:
        what = "not a node fault" if v.klass in ("app", "ignore") else "needs inspection"
    msg = f"XID {xid} on {where} ({v.klass}: {what})"
    if extra:
        msg += f": {extra[:300]}"
    if v.recovery is not None:
        details = {**details, "recovery_action": int(v.recovery)}
    return Finding(
        check=check,
        component=component,
        severity=v.severity,
        code=f"xid.{xid}",
        message=msg,
        action=v.action,
        details={"xid": xid, "class": v.klass, "rule": v.rule, **details},
    )


def parse_kmsg_line(line: str) -> tuple[str, int | None, str] | None:
    """(pci, xid or None for fallen-off-the-bus, rest) or None if the line is not about XIDs."""
    line = line[:MAX_LINE]
    m = XID_RE.search(line)
    if m:
        return m.group(1), int(m.group(2)), m.group(3) or ""
    m = OFF_BUS_RE.search(line)
    if m:
        return m.group(1), None, "GPU has fallen off the bus"
    return None


class KmsgXidCheck(Check):
    """XIDs from the kernel log (agent.kmsg_path). Remembers how far it read."""

    name = "xid.kmsg"
    section = "xid"
    interval_s = 10.0
    timeout_s = 10.0

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._offset = 0
        # sticky until the next reboot, or a reset of that GPU (the agent's reset thread drops
        # them while a run may be adding: one lock)
        self._open: dict[tuple[str, str], Finding] = {}
        self._open_lock = threading.Lock()
        self.malformed_lines = 0

    def _pci_to_gpu(self) -> dict[str, nvml.Device]:
        try:
            devs, _ = nvml.devices()
        except Exception:
            return {}
        return {_norm_pci(d.pci): d for d in devs}

    def _line_finding(
        self,
        pci_map: dict[str, nvml.Device],
        overrides: dict[int, XidClass],
        pci: str,
        xid: int | None,
        rest: str,
    ) -> Finding:
        dev = pci_map.get(_norm_pci(pci))
        gpu = dev.index if dev is not None else None
        comp = f"gpu{gpu}" if gpu is not None else "host"
        where = f"GPU {gpu} (PCI {pci})" if gpu is not None else f"PCI {pci}"
        # the board's identity, for the lemon ledger (a renamed node keeps its GPU's history)
        ids: dict[str, Any] = (
            {"uuid": dev.uuid, **({"serial": dev.serial} if dev.serial else {})} if dev else {}
        )
        if xid is None:
            return self.finding(
                comp,
                Severity.CRITICAL,
                "gpu.fallen_off_bus",
                f"{where}: GPU has fallen off the bus (kernel log)",
                Action.REBOOT,
                pci_bus_id=pci,
                rule="kmsg: fallen off the bus",
                **ids,
            )
        return xid_finding(
            self.name, xid, overrides, comp, where, rest, pci_bus_id=pci, source="kmsg", **ids
        )

    def gpu_was_reset(self, gpu: int, before: float) -> None:
        """A reset of the GPU ended its XIDs logged before it (a reset-class XID 74 or 48 in
        the kernel log stayed open after a good reset: the node was drained again and again)."""
        comp = f"gpu{gpu}"
        with self._open_lock:
            for key in [
                k
                for k, f in self._open.items()
                if f.component == comp and f.observed_at.timestamp() < before
            ]:
                del self._open[key]

    def run(self) -> list[Finding]:
        path = Path(self.ctx.config.agent.kmsg_path)
        overrides = self.ctx.config.checks.xid.overrides
        new: list[str] = []
        try:
            with open(path, "rb") as fh:
                if path.is_file():
                    size = path.stat().st_size
                    if size < self._offset:  # rotated / truncated: start over
                        self._offset = 0
                    new, self._offset = read_log_lines(fh, self._offset)
                else:  # /dev/kmsg: non-blocking reads of whole records
                    new = _read_devkmsg(fh)
        except FileNotFoundError:
            return [self.finding("host", Severity.OK, "kmsg.absent", f"{path} does not exist")]
        except OSError as exc:
            return [
                self.finding(
                    "host",
                    Severity.WARNING,
                    "kmsg.unreadable",
                    f"cannot read {path}: {exc}",
                    Action.INSPECT,
                )
            ]
        pci_map: dict[str, nvml.Device] | None = None
        for line in new:
            # each line under its own error boundary: the offset has already moved past these
            # lines, so one that breaks the parser must not lose the real XIDs after it
            try:
                parsed = parse_kmsg_line(line)
                if not parsed:
                    continue
                if pci_map is None:
                    pci_map = self._pci_to_gpu()
                f = self._line_finding(pci_map, overrides, *parsed)
            except Exception:
                self.malformed_lines += 1
                _log().warning("skipped a kernel-log line that could not be parsed: %.200r", line)
                continue
            if f.severity >= Severity.WARNING:
                with self._open_lock:
                    self._open[(f.component, f.code)] = f
        if self.malformed_lines:
            self.metrics["kmsg_malformed_lines"] = self.malformed_lines
        with self._open_lock:
            still = list(self._open.values())
        return still or [self.finding("host", Severity.OK, "xid.none", "no XIDs in the kernel log")]


CHUNK = 1024 * 1024
MARKERS = (b"NVRM: Xid", b"GPU has fallen off the bus")


def read_log_lines(fh: Any, offset: int, chunk: int = CHUNK) -> tuple[list[str], int]:
    """The XID-related lines of a log file from `offset` to its last complete line, read in
    chunks (memory bounded by one chunk and one line, whatever the log's size) without ever
    splitting a line; returns them and the offset of the first incomplete line (read again
    next time)."""
    fh.seek(offset)
    out: list[str] = []
    carry = b""
    carry_start = offset  # file offset where `carry` begins
    while True:
        data = fh.read(chunk)
        if not data:
            break
        buf = carry + data
        end = buf.rfind(b"\n")
        if end < 0:
            if len(buf) > MAX_LINE:  # longer than any XID line: drop its head, stay bounded
                drop = len(buf) - MAX_LINE
                carry, carry_start = buf[drop:], carry_start + drop
            else:
                carry = buf
            continue
        complete, carry = buf[: end + 1], buf[end + 1 :]
        carry_start += end + 1
        if any(m in complete for m in MARKERS):  # most chunks hold no XID: skip them whole
            for line in complete.splitlines():
                if any(m in line for m in MARKERS):
                    out.append(line.decode("utf-8", "replace"))
    return out, carry_start


def _read_devkmsg(f: Any) -> list[str]:
    import os

    fd = f.fileno()
    os.set_blocking(fd, False)
    lines = []
    while True:
        try:
            rec = os.read(fd, 8192)
        except BlockingIOError:
            break
        except OSError:  # EPIPE when records were overwritten; keep reading
            continue
        if not rec:
            break
        lines.append(rec.decode("utf-8", "replace").split(";", 1)[-1])
    return lines


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
            return xid_finding(
                "xid.nvml", data, overrides, comp, where, "", recovery, source="nvml-event", **ids
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
