"""NVML calls made by the current thread (no pynvml import: the check runner reads it)."""

from __future__ import annotations

import threading

_tls = threading.local()


def add(n: int = 1) -> None:
    _tls.n = getattr(_tls, "n", 0) + n


def calls() -> int:
    return int(getattr(_tls, "n", 0))
