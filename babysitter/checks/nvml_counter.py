"""NVML calls made by the current thread (no pynvml import: the check runner reads it)."""

from __future__ import annotations

import threading

_tls = threading.local()


def add(n: int = 1) -> None:
    try:  # the common case first: the agent counts a million calls a day per node
        _tls.n += n
    except AttributeError:  # this thread's first
        _tls.n = n


def calls() -> int:
    return int(getattr(_tls, "n", 0))
