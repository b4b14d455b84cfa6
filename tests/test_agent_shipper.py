"""The shipper's retries: how many attempts a report gets before it goes to the spool, what is
counted, and that a refusal is not retried."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx

from babysitter.agent.shipper import Shipper
from babysitter.agent.spool import Spool


def shipper(tmp_path: Path, answers: list[int], retries: int = 2) -> tuple[Shipper, list[int]]:
    """A shipper whose controller answers with `answers` in turn (then 202)."""
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        status = answers[len(seen)] if len(seen) < len(answers) else 202
        seen.append(status)
        if status == 0:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(status, text="x")

    ship = Shipper("http://controller", "t", Spool(tmp_path / "spool.db"), retries=retries)
    ship.http = httpx.Client(transport=httpx.MockTransport(handler))
    return ship, seen


def report() -> dict:
    return {"node": "n1", "report_id": str(uuid.uuid4()), "findings": [], "metrics": {}}


def test_a_report_gets_retries_plus_one_attempts_then_goes_to_the_spool(tmp_path):
    ship, seen = shipper(tmp_path, [0, 503, 0, 0])
    waits: list[float] = []
    ship._retrying.sleep = waits.append  # the waits asked for, not how long a machine took
    assert ship._send_with_retry(report()) is False
    assert len(waits) == 2 and all(0 <= w <= 2.0 for w in waits), waits  # capped at 2 s
    assert seen == [0, 503, 0] and ship.failed_attempts == 3 and ship.sent == 0


def test_a_retry_that_gets_through_counts_one_sent(tmp_path):
    ship, seen = shipper(tmp_path, [503, 429])
    assert ship._send_with_retry(report()) is True
    assert seen == [503, 429, 202] and ship.failed_attempts == 2 and ship.sent == 1


def test_a_refused_report_is_dropped_at_once_and_not_counted_sent(tmp_path):
    ship, seen = shipper(tmp_path, [413])
    assert ship._send_with_retry(report()) is True
    assert seen == [413] and ship.refused == 1 and ship.sent == 0 and ship.failed_attempts == 0


def test_each_report_gets_its_own_retries(tmp_path):
    ship, seen = shipper(tmp_path, [0, 0, 0, 0, 0, 0], retries=1)
    assert not ship._send_with_retry(report()) and not ship._send_with_retry(report())
    assert len(seen) == 4 and ship.failed_attempts == 4
