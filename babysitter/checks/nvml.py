"""One NVML session per process, shared by the GPU checks and the XID event thread.

The checks call NVML through `nv`, by pynvml's names: the real pynvml in the agent (the
default), or `nvml_lite` (a ctypes binding of the same calls) in `babysitter check`, which
Slurm runs on every node every few minutes and which cannot afford pynvml's import (see
nvml_lite's docstring). `use()` picks one before the first call. Every call goes through `call()`
so that NOT_SUPPORTED on one board/function becomes "no data" instead of a failure, and garbage
strings from the driver are made printable.
"""

from __future__ import annotations

import importlib
import threading
import time
from types import ModuleType
from typing import Any, Literal

import msgspec

from babysitter.checks import nvml_counter

BINDINGS = {"pynvml": "pynvml", "lite": "babysitter.checks.nvml_lite"}


class _Binding:
    """The chosen binding's module, loaded at the first attribute read (pynvml unless `use()`
    chose otherwise): `nv.nvmlDeviceGetCount`, `nv.NVMLError_GpuIsLost`, ..."""

    def __init__(self) -> None:
        self.module: ModuleType | None = None

    def __getattr__(self, name: str) -> Any:
        module = self.module
        if module is None:
            module = self.module = importlib.import_module(BINDINGS["pynvml"])
        value = getattr(module, name)
        # kept: the next read is a plain attribute (the agent reads constants and functions
        # thousands of times a minute); `use()` forgets them all
        setattr(self, name, value)
        return value

    def choose(self, module: ModuleType) -> None:
        self.__dict__.clear()
        self.module = module


nv: Any = _Binding()


def use(binding: Literal["pynvml", "lite"]) -> None:
    """Call NVML through `binding` from now on (a new session: handles of the other binding
    are not reused)."""
    global _initialized, _cached
    with _lock:
        nv.choose(importlib.import_module(BINDINGS[binding]))
        _initialized = False
        _cached = None
        _identity.clear()


_lock = threading.Lock()
_initialized = False
# identity (name, UUID, PCI bus id) per index: read once, then only the handle lookup per call
IDENTITY_TTL_S = 300.0
_identity: dict[int, tuple[float, str, str, str, str]] = {}
_cached: tuple[float, list[Device], list[LostDevice]] | None = None


class NvmlUnavailable(Exception):
    """NVML could not start (driver not loaded, version mismatch, no library)."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


def init() -> None:
    global _initialized
    with _lock:
        if _initialized:
            return
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise NvmlUnavailable(f"NVML init failed: {exc}", exc.value) from None
        except OSError as exc:  # library missing or unloadable
            raise NvmlUnavailable(f"NVML library not usable: {exc}", None) from None
        _initialized = True


def shutdown() -> None:
    global _initialized
    with _lock:
        if _initialized:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass
            _initialized = False


def printable(v: Any) -> str:
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    s = str(v)
    return "".join(ch if ch.isprintable() else "?" for ch in s)[:96]


NOT_SUPPORTED = object()


_calls = nvml_counter._tls  # nvml_counter.add inlined: call() is the agent's hottest function


def call(fn: Any, *args: Any) -> Any:
    """Call a pynvml function; NOT_SUPPORTED -> the NOT_SUPPORTED sentinel. Counted."""
    try:
        _calls.n += 1
    except AttributeError:  # this thread's first call
        _calls.n = 1
    try:
        return fn(*args)
    except nv.NVMLError_NotSupported:
        return NOT_SUPPORTED


class Device(msgspec.Struct):
    index: int
    handle: Any
    name: str
    uuid: str
    pci: str
    serial: str = ""  # the board's serial ("" where NVML has none): the lemon ledger keys on it

    @property
    def component(self) -> str:
        return f"gpu{self.index}"

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.uuid}, {self.pci})"

    def ids(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "uuid": self.uuid,
            "pci_bus_id": self.pci,
            "name": self.name,
        }
        if self.serial:
            out["serial"] = self.serial
        return out


class LostDevice(msgspec.Struct):
    index: int
    error: str
    code: int


def _serial(handle: Any) -> str:
    """The board serial; "" where NVML has none (consumer boards) or cannot read it."""
    try:
        v = call(nv.nvmlDeviceGetSerial, handle)
    except nv.NVMLError:
        return ""
    return "" if v is NOT_SUPPORTED else printable(v)


def devices(max_age_s: float = 0.0) -> tuple[list[Device], list[LostDevice]]:
    """All GPUs NVML reports; a GPU that is lost / fallen off the bus is listed apart.

    The count and one handle lookup per GPU are read on every call (that is what finds a lost
    GPU); name, UUID and PCI id are cached. `max_age_s` > 0 lets a caller that detects a lost
    GPU by its own reads reuse a recent list instead."""
    global _cached
    now = time.monotonic()
    if max_age_s > 0 and _cached is not None and now - _cached[0] <= max_age_s:
        return list(_cached[1]), list(_cached[2])
    init()
    n = call(nv.nvmlDeviceGetCount)
    ok: list[Device] = []
    lost: list[LostDevice] = []
    for i in range(n):
        try:
            h = call(nv.nvmlDeviceGetHandleByIndex, i)
            ident = _identity.get(i)
            if ident is None or now - ident[0] > IDENTITY_TTL_S:
                name = printable(call(nv.nvmlDeviceGetName, h))
                uuid = printable(call(nv.nvmlDeviceGetUUID, h))
                pci_info = call(nv.nvmlDeviceGetPciInfo, h)
                pci = "unknown" if pci_info is NOT_SUPPORTED else printable(pci_info.busId)
                ident = (now, name, uuid, pci, _serial(h))
                _identity[i] = ident
        except nv.NVMLError as exc:
            _identity.pop(i, None)  # whatever comes back after a reset is read anew
            lost.append(LostDevice(i, str(exc), exc.value))
            continue
        ok.append(Device(i, h, ident[1], ident[2], ident[3], ident[4]))
    _cached = (now, ok, lost)
    return list(ok), list(lost)
