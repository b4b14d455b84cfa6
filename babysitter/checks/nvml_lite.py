"""The part of pynvml's API the one-shot checks call, bound with ctypes directly.

Why: `babysitter check` runs as Slurm's HealthCheckProgram on every node every few minutes, and
importing pynvml (one 8,000-line module of structs, constants and wrappers) costs ~3.3 MB of the
one-shot's 16 MB and ~0.03 s of its 0.06 s CPU (measured, bench/nhc.py). The checks stay one
implementation: they call whichever binding `babysitter.checks.nvml` chose, by pynvml's names,
and get pynvml's values, exceptions and messages (tests/test_nvml_lite.py runs the checks
through both over the fake libnvidia-ml and demands identical findings). The live agent keeps
the real pynvml (events, and every other call).

The same symbols and argument/struct layouts as pynvml 13.615 (nvml.h): a real driver library
answers this module exactly as it answers pynvml."""

from __future__ import annotations

import threading
from ctypes import (
    CDLL,
    Structure,
    Union,
    byref,
    c_char,
    c_char_p,
    c_double,
    c_int,
    c_int32,
    c_int64,
    c_longlong,
    c_uint,
    c_uint8,
    c_uint32,
    c_ulong,
    c_ulonglong,
    c_ushort,
    c_void_p,
    create_string_buffer,
)
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_STATE_INACTIVE = 0
NVML_NVLINK_STATE_ACTIVE = 1
NVML_NVLINK_STATE_SLEEP = 2
NVML_NVLINK_STATE_ACTIVE_TRAFFIC_DISABLED = 3
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_GET_STATE = 165

_NAME_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE
_UUID_BUFFER = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE
_SERIAL_BUFFER = 30  # NVML_DEVICE_SERIAL_BUFFER_SIZE

# pynvml's own texts (NVMLError._errcode_to_string), so a finding reads the same either way
_TEXT = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    8: "Insufficient External Power",
    9: "Driver Not Loaded",
    10: "Timeout",
    11: "Interrupt Request Issue",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    17: "The operating system has blocked the request.",
    18: "RM has detected an NVML/RM version mismatch.",
    20: "Insufficient Memory",
    999: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml.NVMLError: `NVMLError(code)` is the code's subclass; `.value` the code."""

    _by_code: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        text = _TEXT.get(self.value)
        if text is None:
            try:
                text = _error_string(self.value)
            except NVMLError:
                return f"NVML Error with code {self.value}"
        return text

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)

    __hash__ = Exception.__hash__


def _subclass(name: str, code: int) -> type[NVMLError]:
    cls = type(name, (NVMLError,), {})
    NVMLError._by_code[code] = cls
    return cls


# pynvml's names (NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost)
NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_InsufficientSize = _subclass("NVMLError_InsufficientSize", NVML_ERROR_INSUFFICIENT_SIZE)
NVMLError_DriverNotLoaded = _subclass("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_Timeout = _subclass("NVMLError_Timeout", NVML_ERROR_TIMEOUT)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _subclass("NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _subclass("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_LibRmVersionMismatch = _subclass(
    "NVMLError_LibRmVersionMismatch", NVML_ERROR_LIB_RM_VERSION_MISMATCH
)


# nvml.h layouts (x86-64), as pynvml declares them
class nvmlPciInfo_t(Structure):
    _fields_ = [
        ("busIdLegacy", c_char * 16),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * 32),
    ]


class c_nvmlUtilization_t(Structure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class c_nvmlValue_t(Union):
    _fields_ = [
        ("dVal", c_double),
        ("uiVal", c_uint),
        ("ulVal", c_ulong),
        ("ullVal", c_ulonglong),
        ("sllVal", c_longlong),
        ("siVal", c_int),
        ("usVal", c_ushort),
    ]


class c_nvmlFieldValue_t(Structure):
    _fields_ = [
        ("fieldId", c_uint32),
        ("scopeId", c_uint32),
        ("timestamp", c_int64),
        ("latencyUsec", c_int64),
        ("valueType", c_uint),
        ("nvmlReturn", c_uint),
        ("value", c_nvmlValue_t),
    ]


_lock = threading.Lock()
_lib: CDLL | None = None
_fns: dict[str, Any] = {}


def _fn(name: str) -> Any:
    f = _fns.get(name)
    if f is None:
        if _lib is None:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        try:
            f = _fns[name] = getattr(_lib, name)
        except AttributeError:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND) from None
    return f


def _check(ret: int) -> None:
    if ret != NVML_SUCCESS:
        raise NVMLError(ret)


def _error_string(code: int) -> str:
    f = _fn("nvmlErrorString")
    f.restype = c_char_p  # a static string (else ctypes reads an int)
    return bytes(f(code) or b"").decode()


def nvmlInit() -> None:
    global _lib
    with _lock:
        if _lib is None:
            try:
                _lib = CDLL("libnvidia-ml.so.1")  # the name pynvml loads on Linux
            except OSError:
                raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND) from None
    _check(_fn("nvmlInitWithFlags")(c_uint(0)))


def nvmlShutdown() -> None:
    _check(_fn("nvmlShutdown")())


def _uint(name: str, *args: Any) -> int:
    out = c_uint()
    _check(_fn(name)(*args, byref(out)))
    return out.value


def _ull(name: str, *args: Any) -> int:
    out = c_ulonglong()
    _check(_fn(name)(*args, byref(out)))
    return out.value


def nvmlDeviceGetCount() -> int:
    return _uint("nvmlDeviceGetCount_v2")


def nvmlDeviceGetHandleByIndex(index: int) -> c_void_p:
    handle = c_void_p()
    _check(_fn("nvmlDeviceGetHandleByIndex_v2")(c_uint(index), byref(handle)))
    return handle


def _text(name: str, handle: c_void_p, size: int) -> str:
    buf = create_string_buffer(size)
    _check(_fn(name)(handle, buf, c_uint(size)))
    return buf.value.decode()  # pynvml's convertStrBytes: a plain decode


def nvmlDeviceGetName(handle: c_void_p) -> str:
    return _text("nvmlDeviceGetName", handle, _NAME_BUFFER)


def nvmlDeviceGetUUID(handle: c_void_p) -> str:
    return _text("nvmlDeviceGetUUID", handle, _UUID_BUFFER)


def nvmlDeviceGetSerial(handle: c_void_p) -> str:
    return _text("nvmlDeviceGetSerial", handle, _SERIAL_BUFFER)


def nvmlDeviceGetPciInfo(handle: c_void_p) -> nvmlPciInfo_t:
    info = nvmlPciInfo_t()
    _check(_fn("nvmlDeviceGetPciInfo_v3")(handle, byref(info)))
    return info


def nvmlDeviceGetTotalEccErrors(handle: c_void_p, error_type: int, counter: int) -> int:
    return _ull("nvmlDeviceGetTotalEccErrors", handle, c_uint(error_type), c_uint(counter))


def nvmlDeviceGetRetiredPagesPendingStatus(handle: c_void_p) -> int:
    return _uint("nvmlDeviceGetRetiredPagesPendingStatus", handle)


def nvmlDeviceGetRetiredPages(handle: c_void_p, cause: int) -> list[int]:
    fn = _fn("nvmlDeviceGetRetiredPages")
    count = c_uint(0)
    ret = fn(handle, c_uint(cause), byref(count), None)  # first call: the size
    if ret not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
        raise NVMLError(ret)
    count.value = count.value * 2 + 5  # room for pages retired between the two calls
    pages = (c_ulonglong * count.value)()
    _check(fn(handle, c_uint(cause), byref(count), pages))
    return [int(p) for p in pages[0 : count.value]]


def nvmlDeviceGetRemappedRows(handle: c_void_p) -> tuple[int, int, int, int]:
    out = (c_uint(), c_uint(), c_uint(), c_uint())
    _check(_fn("nvmlDeviceGetRemappedRows")(handle, *(byref(x) for x in out)))
    return (out[0].value, out[1].value, out[2].value, out[3].value)


def nvmlDeviceGetNvLinkState(handle: c_void_p, link: int) -> int:
    return _uint("nvmlDeviceGetNvLinkState", handle, link)


def nvmlDeviceGetNvLinkErrorCounter(handle: c_void_p, link: int, counter: int) -> int:
    return _ull("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter)


def nvmlDeviceGetFieldValues(handle: c_void_p, field_ids: list[tuple[int, int]]) -> Any:
    values = (c_nvmlFieldValue_t * len(field_ids))()
    for i, (field_id, scope) in enumerate(field_ids):
        values[i].fieldId, values[i].scopeId = field_id, scope
    _check(_fn("nvmlDeviceGetFieldValues")(handle, c_int32(len(field_ids)), byref(values)))
    return values


def nvmlDeviceGetCurrPcieLinkWidth(handle: c_void_p) -> int:
    return _uint("nvmlDeviceGetCurrPcieLinkWidth", handle)


def nvmlDeviceGetMaxPcieLinkWidth(handle: c_void_p) -> int:
    return _uint("nvmlDeviceGetMaxPcieLinkWidth", handle)


def nvmlDeviceGetCurrPcieLinkGeneration(handle: c_void_p) -> int:
    return _uint("nvmlDeviceGetCurrPcieLinkGeneration", handle)


def nvmlDeviceGetMaxPcieLinkGeneration(handle: c_void_p) -> int:
    return _uint("nvmlDeviceGetMaxPcieLinkGeneration", handle)


def nvmlDeviceGetUtilizationRates(handle: c_void_p) -> c_nvmlUtilization_t:
    util = c_nvmlUtilization_t()
    _check(_fn("nvmlDeviceGetUtilizationRates")(handle, byref(util)))
    return util


def nvmlDeviceGetTemperature(handle: c_void_p, sensor: int) -> int:
    return _uint("nvmlDeviceGetTemperature", handle, c_uint(sensor))


def nvmlDeviceGetTemperatureThreshold(handle: c_void_p, threshold: int) -> int:
    return _uint("nvmlDeviceGetTemperatureThreshold", handle, c_uint(threshold))


def nvmlDeviceGetCurrentClocksEventReasons(handle: c_void_p) -> int:
    return _ull("nvmlDeviceGetCurrentClocksEventReasons", handle)


# ---- GPU fabric (gpu.fabric): pynvml 13's structs and wrappers, same layouts
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_GPU_FABRIC_UUID_LEN = 16
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
nvmlGpuFabricInfo_v2 = 0x02000024
NVMLError_ArgumentVersionMismatch = _subclass(
    "NVMLError_ArgumentVersionMismatch", NVML_ERROR_ARGUMENT_VERSION_MISMATCH
)


class c_nvmlGpuFabricInfo_t(Structure):
    _fields_ = [
        ("clusterUuid", c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", c_int),
        ("cliqueId", c_uint32),
        ("state", c_uint),
    ]


class c_nvmlGpuFabricInfo_v2_t(Structure):
    _fields_ = [
        ("version", c_uint),
        ("clusterUuid", c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", c_int),
        ("cliqueId", c_uint32),
        ("state", c_uint),
        ("healthMask", c_uint32),
    ]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v2)


c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t
nvmlGpuFabricInfo_v3 = 0x03000028


class c_nvmlGpuFabricInfo_v3_t(Structure):
    """v2 plus the driver's health summary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*)."""

    _fields_ = [
        *c_nvmlGpuFabricInfo_v2_t._fields_,
        ("healthSummary", c_uint8),
    ]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v3)


def nvmlDeviceGetGpuFabricInfo(handle: c_void_p, info: Any) -> int:
    _check(_fn("nvmlDeviceGetGpuFabricInfo")(handle, info))
    return NVML_SUCCESS


def nvmlDeviceGetGpuFabricInfoV(handle: c_void_p, info: Any) -> int:
    _check(_fn("nvmlDeviceGetGpuFabricInfoV")(handle, info))
    return NVML_SUCCESS
