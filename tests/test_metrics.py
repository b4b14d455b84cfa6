"""/metrics is valid Prometheus exposition (checked with the real promtool)."""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime

from fastapi.testclient import TestClient

from babysitter.controller.db import audit
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
        c.store_metrics.refresh()
        before = client.get("/metrics").text
        # the database breaks under the running controller
        c.store.engine.dispose()
        db.write_bytes(b"this is not a database" * 512)
        c.store_metrics.refresh()  # the next read of the store-derived values
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


def test_each_drained_node_shows_its_age_owner_and_remediation(secrets, tmp_path):
    """The stuck-drain gauge: one series per drained node, owned by babysitter, an admin or
    someone else, with the phase of its remediation; a resumed node's series goes away."""
    from datetime import timedelta

    from babysitter.controller.loop.decide.ladder import Rung
    from babysitter.controller.loop.read.ledger import Ledger, Phase

    c = Controller(controller_config(secrets, f"sqlite:///{tmp_path / 'm.db'}"))
    c.setup()
    now = datetime.now(UTC)
    try:
        client = TestClient(c.app())
        for node in ("n1", "n2", "n3", "n4", "n5"):
            body = {
                "node": node,
                "report_id": str(uuid.uuid4()),
                "sent_at": now.isoformat(),
                "findings": [],
                "metrics": {},
            }
            client.post("/api/v1/reports", json=body, headers=secrets.headers(node))
        two_h = now - timedelta(hours=2)
        # as babysitter records them: its own reason without the prefix, Slurm's with it
        c.store.set_node("n1", babysitter_drained=True, drain_reason="gpu: lost", drained_at=two_h)
        c.store.set_node(
            "n2",
            drain_reason="[manual] swap the PSU",
            slurm_state="IDLE+DRAIN",
            slurm_reason="babysitter: [manual] swap the PSU",
            drained_at=two_h,
        )
        c.store.set_node(
            "n3", slurm_state="IDLE+DRAIN", slurm_reason="cable work", drained_at=two_h
        )
        c.store.set_node(
            "n4",
            babysitter_drained=True,
            drain_reason="xid 79",
            slurm_state="DOWN+DRAIN+REBOOT_ISSUED",
            slurm_reason="babysitter: reboot: xid 79",
            drained_at=two_h,
        )
        Ledger(c.store).add("n4", Rung.REBOOT, "xid.79", "xid 79", Phase.REBOOTING, now)
        c.store_metrics.refresh()
        before = client.get("/metrics").text
        c.store.set_node("n1", babysitter_drained=False, drain_reason=None)
        c.store_metrics.refresh()
        after = client.get("/metrics").text
    finally:
        c.close()

    def series(text: str) -> dict[str, tuple[str, float]]:
        out = {}
        for line in text.splitlines():
            if line.startswith("babysitter_node_drained_seconds{"):
                labels, value = line.rsplit(" ", 1)
                node = labels.split('node="')[1].split('"')[0]
                out[node] = (labels.split("{", 1)[1].rstrip("}"), float(value))
        return out

    got = series(before)
    assert set(got) == {"n1", "n2", "n3", "n4"}  # n5 is in service
    assert 'owner="babysitter"' in got["n1"][0] and 'remediation="none"' in got["n1"][0]
    assert 'owner="admin"' in got["n2"][0]
    assert 'owner="other"' in got["n3"][0]
    assert 'owner="babysitter"' in got["n4"][0] and 'remediation="rebooting"' in got["n4"][0]
    assert all(7100 < age < 7300 for _, age in got.values())
    assert set(series(after)) == {"n2", "n3", "n4"}


def test_a_fresh_controller_publishes_every_known_counter_at_zero(secrets, tmp_path):
    """A rule on increase() misses a series' first event and a panel shows "no data" when the
    series only appears with it: the counters the rules and the dashboard read start at 0."""
    c = Controller(controller_config(secrets, f"sqlite:///{tmp_path / 'z.db'}"))
    c.setup()
    try:
        text = TestClient(c.app()).get("/metrics").text
    finally:
        c.close()
    for series in (
        'babysitter_drains_total{outcome="done"} 0.0',
        'babysitter_drains_total{outcome="failed"} 0.0',
        'babysitter_resumes_total{outcome="done"} 0.0',
        'babysitter_requeues_total{outcome="done"} 0.0',
        'babysitter_requeues_total{outcome="failed"} 0.0',
        'babysitter_alerts_total{sink="slack",state="firing"} 0.0',
        'babysitter_alerts_total{sink="slack",state="failed"} 0.0',
        'babysitter_alerts_total{sink="alertmanager",state="resolved"} 0.0',
        'babysitter_alerts_total{sink="pagerduty",state="failed"} 0.0',
        'babysitter_alerts_total{sink="webhook",state="failed"} 0.0',
        'babysitter_loop_item_errors_total{item="action"} 0.0',
        'babysitter_loop_item_errors_total{item="decision"} 0.0',
        'babysitter_reports_ingested_total{result="duplicate"} 0.0',
    ):
        assert series in text, series
    # the audit's counts are this process's (other tests' actions included): present, and at
    # what the audit log counted, 0 when nothing was
    counted = audit.totals()
    for kind, rule, result in (
        ("drain", "critical_finding", "failed"),
        ("drain", "critical_finding", "done"),
        ("validate", "validate_before_resume", "failed"),
        ("reboot", "remediation", "failed"),
    ):
        n = float(counted.get((kind, rule, result), 0))
        assert (
            f'babysitter_actions_total{{kind="{kind}",result="{result}",rule="{rule}"}} {n}' in text
        ), (kind, rule, result)


def test_a_fresh_agent_publishes_its_tier_counters_at_zero():
    from prometheus_client import generate_latest

    from babysitter.agent.metrics import AgentMetrics

    text = generate_latest(AgentMetrics("127.0.0.1:0").registry).decode()
    for name in ("tier_cpu_seconds", "nvml_calls", "check_runs"):
        for tier in ("fast", "slow"):
            assert f'babysitter_agent_{name}_total{{tier="{tier}"}} 0.0' in text, (name, tier)


def test_a_read_of_the_store_that_hangs_does_not_keep_publishing_store_up(secrets, tmp_path):
    """A read that never returns (a database host gone without a TCP reset) holds the one read
    slot: the last good values must not go on being published as current with store_up 1."""
    import dataclasses
    import threading

    c = Controller(controller_config(secrets, f"sqlite:///{tmp_path / 'm.db'}"))
    c.setup()
    sm = c.store_metrics
    entered, release = threading.Event(), threading.Event()
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
        sm.refresh()
        assert "babysitter_store_up 1.0" in client.get("/metrics").text

        def hangs():
            entered.set()
            release.wait(60)
            raise RuntimeError("the database went away")

        sm._read_nodes = hangs
        reader = threading.Thread(target=sm.refresh, daemon=True)
        reader.start()
        assert entered.wait(60)
        # the last read is now older than STALE_INTERVALS intervals
        p = sm._published
        sm._published = dataclasses.replace(p, read_at=p.read_at - 3600)
        text = client.get("/metrics").text
    finally:
        release.set()
        reader.join(60)
        c.close()
    assert "babysitter_store_up 0.0" in text
    assert not [line for line in text.splitlines() if line.startswith("babysitter_nodes{")]
    age = [line for line in text.splitlines() if line.startswith("babysitter_store_read_age")]
    assert age and float(age[0].split()[1]) >= 3600
    check = subprocess.run(
        [which("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_first_store_read_that_hangs_does_not_hold_every_scrape(secrets, tmp_path):
    """Before any read was published, a scrape that finds the first read hanging answers
    store_up 0 after a bounded wait instead of waiting with it (each waiting scrape would hold
    one of the readers' workers, the status page's too)."""
    import threading

    from babysitter.controller.api.metrics_snapshot import StoreMetrics

    c = Controller(controller_config(secrets, f"sqlite:///{tmp_path / 'm.db'}"))
    c.setup()
    sm = StoreMetrics(c.store, c.metrics, c.state, interval_s=0.2)
    entered, release = threading.Event(), threading.Event()

    def hangs():
        entered.set()
        release.wait(60)
        raise RuntimeError("the database went away")

    sm._read_nodes = hangs
    reader = threading.Thread(target=sm.refresh, daemon=True)
    reader.start()
    try:
        assert entered.wait(60)
        answer: list[bytes] = []
        scrape = threading.Thread(target=lambda: answer.append(sm.exposition(False)), daemon=True)
        scrape.start()
        scrape.join(30)  # generous; the bound is one interval
        assert answer, "the scrape waited for the hanging read"
        text = answer[0].decode()
    finally:
        release.set()
        reader.join(60)
        c.close()
    assert "babysitter_store_up 0.0" in text
    assert not [line for line in text.splitlines() if line.startswith("babysitter_nodes{")]
