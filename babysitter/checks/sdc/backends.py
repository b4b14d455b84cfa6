"""Matmul backends. Inputs are made on the host from a seed (identical on every device); each
device computes C = A·B and hands C back to the host. The CUDA paths (torch, cupy) are written
to run unchanged on real GPUs: one device per CUDA ordinal, synchronised before timing stops."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Device:
    name: str  # "cpu" or "gpuN" (the finding component)
    label: str  # e.g. "cpu:0", "cuda:3"
    model: str
    matmul: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, float]]


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
    def mm(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
        t = time.perf_counter()
        c = a @ b
        return c, time.perf_counter() - t

    model = _cpu_model()
    return f"numpy-{np.__version__}", [
        Device("cpu", f"cpu:{i}", model, mm) for i in range(replicas)
    ]


def torch_devices(replicas: int = 1) -> tuple[str, list[Device]]:
    try:
        import torch
    except ImportError as exc:
        raise BackendUnavailable("torch is not installed") from exc

    def make(dev: str) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, float]]:
        def mm(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
            ta = torch.from_numpy(a).to(dev)
            tb = torch.from_numpy(b).to(dev)
            if dev.startswith("cuda"):
                torch.cuda.synchronize(dev)
            t = time.perf_counter()
            tc = ta @ tb
            if dev.startswith("cuda"):
                torch.cuda.synchronize(dev)
            took = time.perf_counter() - t
            return tc.cpu().numpy(), took

        return mm

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

    def make(i: int) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, float]]:
        def mm(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
            with cupy.cuda.Device(i):
                ca, cb = cupy.asarray(a), cupy.asarray(b)
                cupy.cuda.Device(i).synchronize()
                t = time.perf_counter()
                cc = ca @ cb
                cupy.cuda.Device(i).synchronize()
                took = time.perf_counter() - t
                return cupy.asnumpy(cc), took

        return mm

    n = cupy.cuda.runtime.getDeviceCount()
    if n == 0:
        raise BackendUnavailable("cupy sees no CUDA device")
    devs = []
    for i in range(n):
        props: Any = cupy.cuda.runtime.getDeviceProperties(i)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        devs.append(Device(f"gpu{i}", f"cuda:{i}", name, make(i)))
    return f"cupy-{cupy.__version__}", devs


def devices(backend: str, replicas: int = 1) -> tuple[str, list[Device]]:
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
        return numpy_devices(replicas)
    raise BackendUnavailable(f"unknown backend {backend!r}")
