"""A node's history shows a lookback window by default (controller.history_lookback_days, 14
days like gpud's XID lookback): an XID from three weeks ago is not on the node's history or in
the findings listing, yet an explicit since= still reaches it within retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from babysitter.controller.db import models as m
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.read.ledger import Ledger, Phase
from tests.fixtures.reports import DBE, WARN, wire_report


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _report(client, secrets, finding: dict) -> None:
    r = client.post(
        "/api/v1/reports", json=wire_report("node1", [finding]), headers=secrets.headers("node1")
    )
    assert r.status_code == 202


def test_the_node_history_shows_the_lookback_window_and_since_reaches_further(client, secrets, ctl):
    assert ctl.cfg.controller.history_lookback_days == 14.0
    _report(client, secrets, DBE)
    old = datetime.now(UTC) - timedelta(days=21)
    with ctl.store.engine.begin() as c:  # the DBE happened three weeks ago
        c.execute(update(m.findings).values(observed_at=old))
    Ledger(ctl.store).add("node1", Rung.RESET_GPU, "gpu", "ecc.dbe", Phase.PASSED, old)
    _report(client, secrets, WARN)
    recent = Ledger(ctl.store)
    recent.add("node1", Rung.REBOOT, "gpu", "xid.79", Phase.PASSED, datetime.now(UTC))

    def codes(**params):
        rows = client.get(
            "/api/v1/findings", params={"node": "node1", **params}, headers=auth(secrets.read)
        ).json()
        return [f["code"] for f in rows]

    assert codes() == [WARN["code"]]
    assert codes(since=(old - timedelta(hours=1)).isoformat()) == [WARN["code"], DBE["code"]]
    node = client.get("/api/v1/nodes/node1", headers=auth(secrets.read)).json()
    assert [r["fault"] for r in node["ledger"]] == ["xid.79"]


def test_a_longer_lookback_shows_more(secrets, db_url):
    from fastapi.testclient import TestClient

    from tests.fixtures.controller import controller_config, set_up

    cfg = controller_config(secrets, db_url, controller={"history_lookback_days": 30})
    with set_up(cfg) as ctl:
        client = TestClient(ctl.app())
        _report(client, secrets, DBE)
        with ctl.store.engine.begin() as c:
            c.execute(update(m.findings).values(observed_at=datetime.now(UTC) - timedelta(days=21)))
        rows = client.get(
            "/api/v1/findings", params={"node": "node1"}, headers=auth(secrets.read)
        ).json()
        assert [f["code"] for f in rows] == [DBE["code"]]
