"""Alert delivery off the policy thread: the router decides what to send and hands each
delivery to this sender's bounded queue; one worker thread posts them (each sink with its own
timeout and retries). A black-holed webhook therefore delays other alerts, never a drain. When
the queue is full the delivery is dropped and counted (babysitter_alerts_dropped_total): the
router's state still says firing, so the next re-send or resolve catches up."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from babysitter.controller.loop.record.alerts.model import Alert
from babysitter.controller.loop.record.alerts.sinks import Sink

log = logging.getLogger(__name__)


@dataclass
class Delivery:
    alert: Alert
    sinks: list[Sink]
    on_done: Callable[[dict[str, str]], None] | None = None


class AlertSender:
    def __init__(
        self,
        queue_size: int = 1000,
        on_sent: Callable[[str, str], None] | None = None,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        self._q: queue.Queue[Delivery | None] = queue.Queue(maxsize=queue_size)
        self.on_sent = on_sent  # (sink name, "firing"|"resolved"|"failed")
        self.on_drop = on_drop
        self.dropped = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, d: Delivery) -> bool:
        self._ensure_started()
        try:
            self._q.put_nowait(d)
            return True
        except queue.Full:
            self.dropped += 1
            if self.on_drop:
                self.on_drop()
            log.warning("alert queue full: dropped %s", d.alert.key)
            return False

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="alert-sender", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            d = self._q.get()
            try:
                if d is None:
                    return
                self._deliver(d)
            except Exception:  # one bad delivery never stops the sender
                log.exception("alert delivery failed")
            finally:
                self._q.task_done()

    def _deliver(self, d: Delivery) -> None:
        results: dict[str, str] = {}
        for sink in d.sinks:
            try:
                results[sink.name] = sink.send(d.alert)
            except Exception as exc:  # a sink bug is recorded on the alert, not raised
                results[sink.name] = f"{type(exc).__name__}: {exc}"
            if self.on_sent:
                state = "resolved" if d.alert.resolved else "firing"
                self.on_sent(sink.name, state if results[sink.name] == "ok" else "failed")
        if d.on_done:
            d.on_done(results)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued delivery was attempted (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._q.unfinished_tasks

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            try:
                self._q.put_nowait(None)
            except queue.Full:
                pass
