"""Wake the policy loop when a node newly reports a drain-worthy finding.

The loop ticks every `loop_interval_s`; a fault stored just after a tick would otherwise wait
most of an interval before it is decided on. The ingest writer calls `note()` after each
commit; the loop waits on `event` (with its interval as the timeout), then `gather()`s and
`begin_tick()`s.

Only news wakes it: a node already reporting the same drain-worthy finding (a drained node
sends it every report) does not, so a broken rack does not turn the loop into a spin. The
memory is per node and only holds nodes that have such findings; it lives in the writer thread.

A single node's fault is decided at once. When several nodes have news since the last tick
(a rack, a switch: their reports arrive over the agents' polling phase, ~1 s), the loop first
waits until the news stops for GATHER_QUIET_S (at most GATHER_MAX_S), so the rack is decided
in one tick and drained with one `scontrol update NodeName=a,b,...` per reason instead of one
per tick that happened to fall between its reports.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from babysitter.controller.loop.decide.node.verdict import drain_worthy
from babysitter.report import Report

Key = tuple[str, str, str]

GATHER_QUIET_S = 0.25  # no news from another node for this long: the burst is over
GATHER_MAX_S = 1.5  # a burst that never stops still gets a tick this often


class DrainWake:
    def __init__(self) -> None:
        self.event = threading.Event()
        self._seen: dict[str, frozenset[Key]] = {}
        # nodes with news since the current tick began, and when the latest came (monotonic);
        # written by the writer thread, read by the policy loop (set.add/len are atomic)
        self._news: set[str] = set()
        self.news_at = 0.0

    def note(self, reports: Iterable[Report]) -> None:
        """Called by the ingest writer after the reports' transaction committed."""
        news: set[str] = set()
        for r in reports:
            keys = frozenset((f.check, f.component, f.code) for f in r.findings if drain_worthy(f))
            before = self._seen.get(r.node, frozenset())
            if keys - before:
                news.add(r.node)
            # an event report adds to what the node has open; a full report is all of it
            now = before | keys if r.kind == "event" else keys
            if now:
                self._seen[r.node] = now
            else:
                self._seen.pop(r.node, None)
        if news:
            self._news.update(news)
            self.news_at = time.monotonic()
            self.event.set()

    def gather(self, stop: threading.Event) -> None:
        """After a wake: when several nodes have news, wait until it stops (see above);
        one node's news returns at once."""
        if len(self._news) < 2:
            return
        end = time.monotonic() + GATHER_MAX_S
        while not stop.is_set():
            until = min(self.news_at + GATHER_QUIET_S, end)
            left = until - time.monotonic()
            if left <= 0:
                return
            stop.wait(left)

    def begin_tick(self) -> None:
        """The loop is about to read the store: news from here on is the next tick's."""
        self.event.clear()
        self._news = set()
