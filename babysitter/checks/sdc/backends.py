"""Matmul backends. Inputs are made on the host from a seed (identical on every device); each
device computes C = A·B. numpy devices hand C back to the host, which verifies it there. torch
and cupy devices verify C where it is: column/row sums and a bit-exact fingerprint are computed
on the device and only those few small vectors are copied back (a host copy of a 16 MB C would
cost many times the matmul on a GPU). The CUDA paths are written to run unchanged on real GPUs:
one device per CUDA ordinal, synchronised before any timer stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from babysitter.checks.sdc import abft, fingerprint

# (row, col, bit) of C to flip on this device, before verification (fault injection)
Inject = tuple[int, int, int]


@dataclass
class DeviceOutput:
    matmul_s: float
    c: np.ndarray | None = None  # host devices: C itself, verified and hashed on the host
    col_sums: np.ndarray | None = None  # the others: eᵀC, Ce and fingerprint from the device
    row_sums: np.ndarray | None = None
    fingerprint: str | None = None
    device_verify_s: float = 0.0  # checksums + fingerprint on the device + their transfer


@dataclass
class Device:
    name: str  # "cpu" or "gpuN" (the finding component)
    label: str  # e.g. "cpu:0", "cuda:3"
    model: str
    run: Callable[[np.ndarray, np.ndarray, Inject | None], DeviceOutput]


class BackendUnavailable(Exception):
    pass


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def numpy_devices(replicas: int = 1) -> tuple[str, list[Device]]:
    def run(a: np.ndarray, b: np.ndarray, inject: Inject | None) -> DeviceOutput:
        t = time.perf_counter()
        c = a @ b
        took = time.perf_counter() - t
        c = np.ascontiguousarray(c)
        if inject:
            abft.flip_bit(c, *inject)
        return DeviceOutput(took, c=c)

    model = _cpu_model()
    return f"numpy-{np.__version__}", [
        Device("cpu", f"cpu:{i}", model, run) for i in range(replicas)
    ]


def _unpack(packed: np.ndarray, rows: int, cols: int, sum_dtype: Any) -> DeviceOutput:
    """Split the one transfer [eᵀC | Ce | fingerprint] (integer bit patterns) on the host."""
    col = packed[:cols].view(sum_dtype)
    row = packed[cols : cols + rows].view(sum_dtype)
    fp = fingerprint.to_hex(packed[cols + rows :].view(np.int64))
    return DeviceOutput(0.0, col_sums=col, row_sums=row, fingerprint=fp)


# Fingerprint weights already on a device, per (device, size): run_sdc builds new Device objects
# on every run, so the cache lives here. Tiny (4n int64 per entry).
_WEIGHTS_MAX = 16
_weights: dict[tuple[str, int, int], tuple[Any, ...]] = {}
_weights_lock = threading.Lock()


def _device_weights(dev: str, shape: tuple[int, int], upload: Callable[[np.ndarray], Any]) -> Any:
    key = (dev, *shape)
    with _weights_lock:
        w = _weights.get(key)
        if w is None:
            if len(_weights) >= _WEIGHTS_MAX:
                _weights.clear()
            w = _weights[key] = tuple(upload(x) for x in fingerprint.weights(*shape))
        return w


def torch_flip_bit(tc: Any, i: int, j: int, bit: int) -> None:
    """abft.flip_bit for a torch tensor, in place on its device (no host copy)."""
    size = tc.element_size()
    abft.check_bit(bit, size, tc.dtype)
    mask = 1 << bit
    if mask >= 1 << (size * 8 - 1):  # the sign bit, as a signed value of that width
        mask -= 1 << (size * 8)
    fingerprint.torch_int_view(tc)[i, j] ^= mask


def torch_devices(replicas: int = 1) -> tuple[str, list[Device]]:
    try:
        import torch
    except ImportError as exc:
        raise BackendUnavailable("torch is not installed") from exc

    sum_of = {np.float32: torch.float32, np.float64: torch.float64}

    def make(dev: str) -> Callable[[np.ndarray, np.ndarray, Inject | None], DeviceOutput]:
        cuda = dev.startswith("cuda")

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(dev)

        def run(a: np.ndarray, b: np.ndarray, inject: Inject | None) -> DeviceOutput:
            ta = torch.from_numpy(a).to(dev)
            tb = torch.from_numpy(b).to(dev)
            sync()
            # full float32: with TF32 allowed (a site or library default) the matmul itself
            # breaks the ABFT rounding bound and healthy GPUs would be reported
            precision = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("highest")
            try:
                t = time.perf_counter()
                tc = ta @ tb
                sync()
                took = time.perf_counter() - t
            finally:
                torch.set_float32_matmul_precision(precision)
            tc = tc.contiguous()
            if inject:
                torch_flip_bit(tc, *inject)
                sync()
            shape = (tc.shape[0], tc.shape[1])
            # cached per device and size, like the reference: not part of verify_s
            w = _device_weights(dev, shape, lambda x: torch.from_numpy(x.copy()).to(dev))
            sum_np = abft.SUM_DTYPE[a.dtype.name]
            sum_dt = sum_of[sum_np]
            t = time.perf_counter()
            cs = tc if tc.dtype == sum_dt else tc.to(sum_dt)
            ity = fingerprint.torch_int_view(cs).dtype
            # one device-to-host copy of n + n + 2 words; .cpu() waits for the kernels
            packed = torch.cat(
                [
                    cs.sum(dim=0).view(ity),
                    cs.sum(dim=1).view(ity),
                    fingerprint.torch_sums(tc, w).view(ity),
                ]
            ).cpu()
            out = _unpack(packed.numpy(), shape[0], shape[1], sum_np)
            out.matmul_s, out.device_verify_s = took, time.perf_counter() - t
            return out

        return run

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        devs = [
            Device(f"gpu{i}", f"cuda:{i}", torch.cuda.get_device_name(i), make(f"cuda:{i}"))
            for i in range(torch.cuda.device_count())
        ]
    else:
        devs = [Device("cpu", f"cpu:{i}", _cpu_model(), make("cpu")) for i in range(replicas)]
    return f"torch-{torch.__version__}", devs


def cupy_devices(replicas: int = 1) -> tuple[str, list[Device]]:
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailable("cupy is not installed (pip install babysitter[cupy])") from exc

    def make(i: int) -> Callable[[np.ndarray, np.ndarray, Inject | None], DeviceOutput]:
        def run(a: np.ndarray, b: np.ndarray, inject: Inject | None) -> DeviceOutput:
            d = cupy.cuda.Device(i)
            with d:
                ca, cb = cupy.asarray(a), cupy.asarray(b)
                d.synchronize()
                t = time.perf_counter()
                cc = ca @ cb
                d.synchronize()
                took = time.perf_counter() - t
                cc = cupy.ascontiguousarray(cc)
                if inject:
                    abft.flip_bit(cc, *inject)  # in place on the GPU
                    d.synchronize()
                shape = (int(cc.shape[0]), int(cc.shape[1]))
                w = _device_weights(f"cupy:{i}", shape, cupy.asarray)  # not timed
                sum_np = abft.SUM_DTYPE[a.dtype.name]
                t = time.perf_counter()
                cs = cc if cc.dtype == sum_np else cc.astype(sum_np)
                ity = fingerprint.int_view_dtype(cs.dtype.itemsize)
                packed = cupy.concatenate(
                    [
                        cs.sum(axis=0).view(ity),
                        cs.sum(axis=1).view(ity),
                        fingerprint.cupy_sums(cc, w).view(ity),
                    ]
                )
                out = _unpack(cupy.asnumpy(packed), shape[0], shape[1], sum_np)  # waits
                out.matmul_s, out.device_verify_s = took, time.perf_counter() - t
                return out

        return run

    n = cupy.cuda.runtime.getDeviceCount()
    if n == 0:
        raise BackendUnavailable("cupy sees no CUDA device")
    devs = []
    for i in range(n):
        props: Any = cupy.cuda.runtime.getDeviceProperties(i)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        devs.append(Device(f"gpu{i}", f"cuda:{i}", name, make(i)))
    return f"cupy-{cupy.__version__}", devs


def nvml_gpu_count() -> int:
    """GPUs NVML lists on this node, lost ones included; 0 only where there is no NVML library
    at all. NVML failing where it is installed (the driver not loaded after a reboot) says
    nothing about the GPUs: BackendUnavailable, never "0 GPUs, run on the CPU"."""
    from babysitter.checks import nvml

    try:
        ok, lost = nvml.devices()
    except nvml.NvmlUnavailable as exc:
        if exc.code == nvml.nv.NVML_ERROR_LIBRARY_NOT_FOUND:
            return 0
        raise BackendUnavailable(f"{exc}: cannot tell this node's GPUs") from None
    except Exception as exc:
        raise BackendUnavailable(f"NVML could not list the GPUs: {exc}") from None
    return len(ok) + len(lost)


def devices(backend: str, replicas: int = 1) -> tuple[str, list[Device]]:
    """The backend's devices. `auto` takes the first GPU backend that sees a GPU and falls back
    to numpy only where NVML shows no GPU: on a GPU node a CPU run would pass the node without
    touching its GPUs, so it fails closed there (an explicit `numpy` still runs, for test
    clusters, and the result names it)."""
    if backend == "numpy":
        return numpy_devices(replicas)
    if backend == "torch":
        return torch_devices(replicas)
    if backend == "cupy":
        return cupy_devices(replicas)
    if backend == "auto":
        for fn in (cupy_devices, torch_devices):
            try:
                lib, devs = fn(replicas)
                if any(d.name.startswith("gpu") for d in devs):
                    return lib, devs
            except BackendUnavailable:
                continue
        gpus = nvml_gpu_count()
        if gpus:
            raise BackendUnavailable(
                f"NVML shows {gpus} GPU(s) but no GPU backend (torch or cupy with CUDA) works: "
                'backend "auto" will not test a GPU node on the CPU (install one, or set '
                '[checks.sdc] backend = "numpy" to test the CPU only)'
            )
        return numpy_devices(replicas)
    raise BackendUnavailable(f"unknown backend {backend!r}")
