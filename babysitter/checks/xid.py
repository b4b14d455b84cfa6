"""XIDs, two ways: NVML critical-error events (one waiting thread per agent) and the kernel log
(`NVRM: Xid (PCI:0000:3b:00): 79, pid=…` and `GPU has fallen off the bus`)."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from babysitter.checks import nvml
from babysitter.checks.base import Check, EventSource, register, register_event_source
from babysitter.checks.xid_catalog import classify
from babysitter.finding import Action, Finding, Severity

log = logging.getLogger(__name__)

XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)(?:, (.*))?")
OFF_BUS_RE = re.compile(r"NVRM: GPU at PCI:([0-9A-Fa-f:.]+): GPU has fallen off the bus")
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
    overrides: dict[int, str],
    component: str,
    where: str,
    extra: str = "",
    **details: Any,
) -> Finding:
    v = classify(xid, overrides)
    node_fault = v.klass in ("reboot", "reset_gpu")
    what = (
        "node fault"
        if node_fault
        else ("not a node fault" if v.klass in ("app", "ignore") else "needs inspection")
    )
    msg = f"XID {xid} on {where} ({v.klass}: {what})"
    if extra:
        msg += f": {extra[:300]}"
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
        try:
            xid = int(m.group(2))
        except ValueError:
            return None
        return m.group(1), xid, m.group(3) or ""
    m = OFF_BUS_RE.search(line)
    if m:
        return m.group(1), None, "GPU has fallen off the bus"
    return None


@register
class KmsgXidCheck(Check):
    """XIDs from the kernel log (agent.kmsg_path). Remembers how far it read."""

    name = "xid.kmsg"
    section = "xid"
    interval_s = 10.0
    timeout_s = 10.0

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._offset = 0
        self._open: dict[tuple[str, str], Finding] = {}  # sticky until the next reboot

    def _pci_to_gpu(self) -> dict[str, int]:
        try:
            devs, _ = nvml.devices()
        except Exception:
            return {}
        return {_norm_pci(d.pci): d.index for d in devs}

    def run(self) -> list[Finding]:
        path = Path(self.ctx.config.agent.kmsg_path)
        overrides = self.ctx.config.checks.xid.actions
        new: list[str] = []
        try:
            with open(path, "rb") as fh:
                if path.is_file():
                    size = path.stat().st_size
                    if size < self._offset:  # rotated / truncated: start over
                        self._offset = 0
                    fh.seek(self._offset)
                    data = fh.read(8 * 1024 * 1024)
                    self._offset += len(data)
                    new = data.decode("utf-8", "replace").splitlines()
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
        pci_map: dict[str, int] | None = None
        for line in new:
            parsed = parse_kmsg_line(line)
            if not parsed:
                continue
            pci, xid, rest = parsed
            if pci_map is None:
                pci_map = self._pci_to_gpu()
            gpu = pci_map.get(_norm_pci(pci))
            comp = f"gpu{gpu}" if gpu is not None else "host"
            where = f"GPU {gpu} (PCI {pci})" if gpu is not None else f"PCI {pci}"
            if xid is None:
                f = self.finding(
                    comp,
                    Severity.CRITICAL,
                    "gpu.fallen_off_bus",
                    f"{where}: GPU has fallen off the bus (kernel log)",
                    Action.REBOOT,
                    pci_bus_id=pci,
                    rule="kmsg: fallen off the bus",
                )
            else:
                f = xid_finding(
                    self.name, xid, overrides, comp, where, rest, pci_bus_id=pci, source="kmsg"
                )
            if f.severity >= Severity.WARNING:
                self._open[(f.component, f.code)] = f
        return list(self._open.values()) or [
            self.finding("host", Severity.OK, "xid.none", "no XIDs in the kernel log")
        ]


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


@register_event_source
class NvmlXidEvents(EventSource):
    """One thread blocked in nvmlEventSetWait_v2; each XID becomes findings at once."""

    name = "xid.nvml"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def supported(self) -> bool:
        try:
            devs, _ = nvml.devices()
        except Exception:
            return False
        return bool(devs)

    def start(self, emit: Callable[[list[Finding]], None]) -> None:
        self._thread = threading.Thread(
            target=self._loop, args=(emit,), name="xid-events", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)

    def _loop(self, emit: Callable[[list[Finding]], None]) -> None:
        overrides = self.ctx.config.checks.xid.actions
        try:
            devs, _ = nvml.devices()
            es = pynvml.nvmlEventSetCreate()
            by_uuid = {}
            for d in devs:
                try:
                    pynvml.nvmlDeviceRegisterEvents(
                        d.handle, pynvml.nvmlEventTypeXidCriticalError, es
                    )
                    by_uuid[d.index] = d
                except pynvml.NVMLError as exc:
                    log.warning("cannot register XID events on %s: %s", d.label, exc)
        except (pynvml.NVMLError, nvml.NvmlUnavailable) as exc:
            log.warning("NVML events unavailable: %s", exc)
            return
        while not self._stop.is_set():
            try:
                ev = pynvml.nvmlEventSetWait_v2(es, 500)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                if isinstance(exc, pynvml.NVMLError_GPUIsLost):
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
                idx = pynvml.nvmlDeviceGetIndex(ev.device)
            except pynvml.NVMLError:
                idx = -1
            found = by_uuid.get(idx)
            comp = f"gpu{idx}" if idx >= 0 else "host"
            where = found.label if found else f"GPU {idx}"
            emit(
                [
                    xid_finding(
                        "xid.nvml",
                        int(ev.eventData),
                        overrides,
                        comp,
                        where,
                        source="nvml-event",
                        **(found.ids() if found else {}),
                    )
                ]
            )
        try:
            pynvml.nvmlEventSetFree(es)
        except pynvml.NVMLError:
            pass
