"""Lines that name a fault but match no pattern: counted per source and sampled for the admin,
never silently dropped. A kernel-log line that says "Xid" or a job-log line that says NCCL failed
in a wording babysitter does not know is evidence of a format it has not learnt: the agent's
`babysitter_unparsed_lines_total{source}` counts them, and the newest few of each source travel
with the check's metrics (`unparsed_lines`) to the controller, where an admin can read them.

One registry per agent process (the checks of one agent share it): the sources are fixed
strings ("kmsg", "job_log"), so the labels stay bounded whatever the lines say.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

SAMPLES_KEPT = 5  # per source: the newest, enough to write a pattern from
SAMPLE_CHARS = 500  # a sample is cut here: a log line can be as long as its writer likes


class UnparsedLines:
    """Counts and newest samples of unparsed lines, per source (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._samples: dict[str, deque[tuple[float, str]]] = {}

    def note(self, source: str, line: str) -> None:
        with self._lock:
            self._counts[source] = self._counts.get(source, 0) + 1
            kept = self._samples.setdefault(source, deque(maxlen=SAMPLES_KEPT))
            kept.append((time.time(), line[:SAMPLE_CHARS]))

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def snapshot(self) -> dict[str, Any]:
        """{source: {"total": n, "samples": [{"at": unix time, "line": str}, ...]}}."""
        with self._lock:
            return {
                source: {
                    "total": n,
                    "samples": [{"at": at, "line": line} for at, line in self._samples[source]],
                }
                for source, n in self._counts.items()
            }

    def clear(self) -> None:
        """Tests only: a fresh registry."""
        with self._lock:
            self._counts.clear()
            self._samples.clear()


REGISTRY = UnparsedLines()


def note(source: str, line: str) -> None:
    """Count one unparsed line of `source` ("kmsg", "job_log") and keep it as a sample."""
    REGISTRY.note(source, line)
