"""/metrics is valid Prometheus exposition (checked with the real promtool)."""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime

from fastapi.testclient import TestClient

from babysitter.controller.runtime import Controller
from tests.fixtures.controller import controller_config, which


def test_metrics_pass_promtool(secrets, tmp_path):
    c = Controller(controller_config(secrets, f"sqlite:///{tmp_path / 'm.db'}"))
    c.setup()
    try:
        client = TestClient(c.app())
        body = {
            "node": "n1",
            "report_id": str(uuid.uuid4()),
            "sent_at": datetime.now(UTC).isoformat(),
            "findings": [],
            "metrics": {},
        }
        client.post("/api/v1/reports", json=body, headers=secrets.headers("n1"))
        text = client.get("/metrics").text
    finally:
        c.close()
    assert 'babysitter_reports_ingested_total{result="new"} 1.0' in text
    assert 'babysitter_nodes{verdict="healthy"} 1.0' in text
    r = subprocess.run(
        [which("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_database_that_cannot_be_read_never_publishes_a_healthy_zero(secrets, tmp_path):
    db = tmp_path / "m.db"
    c = Controller(controller_config(secrets, f"sqlite:///{db}"))
    c.setup()
    try:
        client = TestClient(c.app())
        body = {
            "node": "n1",
            "report_id": str(uuid.uuid4()),
            "sent_at": datetime.now(UTC).isoformat(),
            "findings": [],
            "metrics": {},
        }
        client.post("/api/v1/reports", json=body, headers=secrets.headers("n1"))
        before = client.get("/metrics").text
        # the database breaks under the running controller
        c.store.engine.dispose()
        db.write_bytes(b"this is not a database" * 512)
        r = client.get("/metrics")
    finally:
        c.close()
    assert "babysitter_store_up 1.0" in before
    assert 'babysitter_nodes{verdict="healthy"} 1.0' in before
    assert r.status_code == 200, r.text
    text = r.text
    assert "babysitter_store_up 0.0" in text
    assert "babysitter_store_read_errors_total 1.0" in text
    # no count per verdict at all: neither the old 1 healthy nor "0 unhealthy"
    assert not [line for line in text.splitlines() if line.startswith("babysitter_nodes{")]
    assert "babysitter_nodes_drained NaN" in text and "babysitter_guard_tripped NaN" in text
    check = subprocess.run(
        [which("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
