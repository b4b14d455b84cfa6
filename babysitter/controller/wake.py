"""Wake the policy loop when a node newly reports a drain-worthy finding.

The loop ticks every `loop_interval_s`; a fault stored just after a tick would otherwise wait
most of an interval before it is decided on. The ingest writer calls `note()` after each
commit; the loop waits on `event` (with its interval as the timeout) and clears it.

Only news wakes it: a node already reporting the same drain-worthy finding (a drained node
sends it every report) does not, so a broken rack does not turn the loop into a spin. The
memory is per node and only holds nodes that have such findings; it lives in the writer thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from babysitter.controller.policy import drain_worthy
from babysitter.report import Report

Key = tuple[str, str, str]


class DrainWake:
    def __init__(self) -> None:
        self.event = threading.Event()
        self._seen: dict[str, frozenset[Key]] = {}

    def note(self, reports: Iterable[Report]) -> None:
        """Called by the ingest writer after the reports' transaction committed."""
        news = False
        for r in reports:
            keys = frozenset((f.check, f.component, f.code) for f in r.findings if drain_worthy(f))
            before = self._seen.get(r.node, frozenset())
            if keys - before:
                news = True
            # an event report adds to what the node has open; a full report is all of it
            now = before | keys if r.kind == "event" else keys
            if now:
                self._seen[r.node] = now
            else:
                self._seen.pop(r.node, None)
        if news:
            self.event.set()
