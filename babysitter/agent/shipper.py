"""Ship reports to the controller: httpx with timeouts, a few retries with backoff + jitter,
then the spool. Spooled reports are replayed in order before anything new is sent, so the
controller sees a node's history in order."""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from typing import Any

import httpx

from babysitter.agent.spool import Spool

log = logging.getLogger(__name__)


class Shipper:
    def __init__(
        self, url: str, token: str, spool: Spool, timeout_s: float = 5.0, retries: int = 2
    ) -> None:
        self.url = url.rstrip("/") + "/api/v1/reports"
        self.spool = spool
        self.retries = retries
        self.http = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {token}"})
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=10_000)
        self._thread = threading.Thread(target=self._run, name="shipper", daemon=True)
        self.sent = 0
        self.failed_attempts = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._q.put(None)
        self._thread.join(timeout)

    def submit(self, report: dict[str, Any]) -> None:
        """Never blocks the caller: if even the in-memory queue is full, go to the spool."""
        try:
            self._q.put_nowait(report)
        except queue.Full:
            self.spool.put(report)

    def _post(self, report: dict[str, Any]) -> bool:
        """True when the controller has the report (202 new or 200 duplicate)."""
        try:
            r = self.http.post(self.url, json=report)
        except httpx.HTTPError as exc:
            log.debug("controller unreachable: %s", exc)
            return False
        if r.status_code in (200, 202):
            return True
        if r.status_code in (401, 403, 422):
            # retrying cannot help; keep it out of the spool loop but say so loudly
            log.error(
                "controller refused report %s: %s %s",
                report.get("report_id"),
                r.status_code,
                r.text[:200],
            )
            return True
        return False

    def _send_with_retry(self, report: dict[str, Any]) -> bool:
        for attempt in range(self.retries + 1):
            if self._post(report):
                self.sent += 1
                return True
            self.failed_attempts += 1
            if attempt < self.retries:
                time.sleep(min(2.0, 0.1 * 2**attempt) * (0.5 + random.random()))
        return False

    def _replay(self) -> bool:
        """Send spooled reports in order; False if the controller is still away."""
        while True:
            batch = self.spool.peek(50)
            if not batch:
                return True
            for seq, rep in batch:
                rep.setdefault("metrics", {})["spool_replayed"] = True
                if not self._post(rep):
                    return False
                self.spool.remove(seq)

    def _run(self) -> None:
        while True:
            try:
                report = self._q.get(timeout=1.0)
            except queue.Empty:
                report = None
                if self.spool.size():
                    self._replay()
                continue
            if report is None:
                return
            if self.spool.size() and not self._replay():
                self.spool.put(report)
                continue
            if not self._send_with_retry(report):
                self.spool.put(report)
