"""Ship reports to the controller: httpx with timeouts, a few retries (tenacity: capped
exponential backoff with jitter), then the spool. Spooled reports are replayed in order before
anything new is sent, so the controller sees a node's history in order. A report the controller
refuses for what it is (a 4xx other than 408/429: too big, invalid, not this node's) is dropped
and counted, never replayed: it would be refused again and hold up everything queued behind
it."""

from __future__ import annotations

import json
import logging
import queue
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_result,
    stop_after_attempt,
    wait_random_exponential,
)

from babysitter.agent.spool import Spool
from babysitter.wire import HEADER as WIRE_HEADER
from babysitter.wire import WIRE_VERSION, peer_version

log = logging.getLogger(__name__)


# answers that say "not now" rather than "never": the report is kept and sent again
_RETRYABLE_4XX = frozenset({408, 425, 429})


def tls_verify(ca_file: Path | None) -> ssl.SSLContext | bool:
    """What httpx verifies an https controller with: the given CA bundle, else the system's."""
    if ca_file is None:
        return True
    return ssl.create_default_context(cafile=str(ca_file))


class Shipper:
    def __init__(
        self,
        url: str,
        token: str,
        spool: Spool,
        timeout_s: float = 5.0,
        retries: int = 2,
        node: str | None = None,
        ca_file: Path | None = None,
        on_orders: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.url = url.rstrip("/") + "/api/v1/reports"
        # the controller's orders ride on its answers to reports (no extra request per node)
        self.on_orders = on_orders
        self.spool = spool
        self.retries = retries
        # the report's wire version (babysitter/wire.py): in a header, which a controller of
        # the previous release ignores, where an unknown body key would get the report refused
        headers = {"Authorization": f"Bearer {token}", WIRE_HEADER: str(WIRE_VERSION)}
        if node:
            # lets the controller check the token before it reads the body
            headers["X-Babysitter-Node"] = node
        self.http = httpx.Client(timeout=timeout_s, headers=headers, verify=tls_verify(ca_file))
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=10_000)
        self._thread = threading.Thread(target=self._run, name="shipper", daemon=True)
        self.sent = 0
        self.failed_attempts = 0
        self.refused = 0  # reports the controller refused with a 4xx, dropped
        # the controller's wire version, from its last answer (0: none yet); reported in the
        # agent's metrics so that a rolling upgrade shows who talks to whom
        self.controller_wire = 0
        self._refusals_logged: set[int] = set()
        # one report: `retries` more attempts after the first, 0.1 s doubling up to 2 s apart,
        # jittered so that nodes cut off together do not come back in step
        self._retrying = Retrying(
            stop=stop_after_attempt(retries + 1),
            wait=wait_random_exponential(multiplier=0.1, max=2.0),
            retry=retry_if_result(lambda done: not done),
            after=self._failed_attempt,
            retry_error_callback=lambda _state: False,
        )

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
        """True when the controller is done with the report: it has it (202 new or 200
        duplicate) or refused it for good (4xx: counted and dropped)."""
        try:
            # NaN/Infinity are not JSON: the controller would refuse them, so would httpx
            body = json.dumps(report, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            self._refuse(report, 0, f"not encodable as JSON: {exc}")
            return True
        try:
            r = self.http.post(self.url, content=body, headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            log.debug("controller unreachable: %s", exc)
            return False
        if r.status_code in (200, 202):
            self.controller_wire = peer_version(r.headers.get(WIRE_HEADER))
            self._orders(r)
            return True
        if 400 <= r.status_code < 500 and r.status_code not in _RETRYABLE_4XX:
            self._refuse(report, r.status_code, r.text[:200])
            return True
        return False

    def _orders(self, r: httpx.Response) -> None:
        """Hand the orders in an answer to the agent; an answer without any is not parsed."""
        if self.on_orders is None or b'"orders"' not in r.content:
            return
        try:
            orders = r.json().get("orders")
        except (ValueError, AttributeError):
            return
        if isinstance(orders, list):
            try:
                self.on_orders([o for o in orders if isinstance(o, dict)])
            except Exception:  # an order must never stop the shipping of reports
                log.exception("could not take the controller's orders")

    def _refuse(self, report: dict[str, Any], status: int, why: str) -> None:
        """Drop a report that can never be accepted; count it, log once per status (a wrong
        token refuses every report: the log must not flood)."""
        self.refused += 1
        self.spool.count("refused")
        if status not in self._refusals_logged:
            self._refusals_logged.add(status)
            log.error(
                "report %s refused (%s), dropped; further refusals like it are only counted: %s",
                report.get("report_id"),
                status or "by the agent",
                why,
            )

    def _failed_attempt(self, _state: RetryCallState) -> None:
        self.failed_attempts += 1

    def _send_with_retry(self, report: dict[str, Any]) -> bool:
        """True when the controller is done with the report; False: spool it."""
        refused = self.refused
        done: bool = self._retrying(self._post, report)
        if done and self.refused == refused:  # done, and not by a refusal
            self.sent += 1
        return done

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
                # idle with an empty spool: sleep until the next report (a wake-up a second
                # for nothing costs CPU on every node); with a spool, retry it every second
                report = self._q.get(timeout=1.0 if self.spool.size() else None)
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
