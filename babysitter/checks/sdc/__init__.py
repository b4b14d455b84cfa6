"""Silent-data-corruption test: a seeded matmul on every local device, verified with
algorithm-based checksums (Huang & Abraham) and by bit-identical comparison across devices
(or against a stored golden digest when there is only one).

The runner (numpy) is imported on first use, and never by the agent: its ordered tests run in
a child process (child.py, worker.py)."""

from __future__ import annotations

from typing import Any

__all__ = ["DeviceResult", "SdcResult", "run_sdc"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from babysitter.checks.sdc import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
