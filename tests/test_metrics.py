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
