"""Alert sinks and routing: a real Alertmanager, and a local HTTP receiver standing in for
Slack, PagerDuty and a webhook (those services cannot be reached from the test machines)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from babysitter.config import parse_config
from babysitter.controller.loop.record.alerts import Alert, AlertRouter
from babysitter.controller.loop.record.alerts.router import sinks_from_config
from babysitter.finding import Severity
from tests.fixtures.slurm import wait_for

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class MemoryState:
    """In-memory alert state with the store's interface (the store is tested elsewhere)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def upsert_alert(self, key: str, **values: Any) -> None:
        self.rows.setdefault(key, {"key": key}).update(values)

    def upsert_alerts(self, rows: list[tuple[str, dict[str, Any]]]) -> None:
        for key, values in rows:
            self.upsert_alert(key, **values)

    def firing_alerts(self) -> list[dict[str, Any]]:
        return [r for r in self.rows.values() if r.get("state") == "firing"]


def unhealthy(node: str, when: datetime = NOW) -> Alert:
    return Alert(
        node,
        "node_unhealthy",
        Severity.CRITICAL,
        "xid.kmsg: XID 79 on GPU 3 (reboot: node fault)",
        f"drained {node} in Slurm",
        when,
    )


def router_for(**alerts: str) -> AlertRouter:
    cfg = parse_config({"alerts": alerts})
    return AlertRouter(sinks_from_config(cfg), MemoryState(), group_threshold=3)


def test_alertmanager_gets_firing_then_resolved(alertmanager, receiver):
    r = router_for(alertmanager_url=alertmanager)
    r.process([unhealthy("node2")], [], NOW)

    def got(status: str) -> bool:
        return any(b.get("status") == status for b in receiver.bodies("/am"))

    wait_for(lambda: got("firing"), 20, "firing notification from alertmanager")
    body = next(b for b in receiver.bodies("/am") if b["status"] == "firing")
    a = body["alerts"][0]
    assert a["labels"]["node"] == "node2" and a["labels"]["severity"] == "critical"
    assert "What to do" in a["annotations"]["description"]
    assert "drained node2" in a["annotations"]["action_taken"]

    r.process([], [("node2", "node_unhealthy")], NOW + timedelta(seconds=5))
    wait_for(lambda: got("resolved"), 20, "resolved notification from alertmanager")


def test_dedup_same_condition_is_sent_once_until_repeat_interval(receiver):
    r = router_for(webhook_url=receiver.url + "/hook")
    r.process([unhealthy("node2")], [], NOW)
    r.process([unhealthy("node2")], [], NOW + timedelta(minutes=1))
    assert len(receiver.bodies("/hook")) == 1
    r.process([unhealthy("node2")], [], NOW + timedelta(hours=5))
    assert len(receiver.bodies("/hook")) == 2


def test_resolve_only_when_firing(receiver):
    r = router_for(webhook_url=receiver.url + "/hook")
    r.process([], [("node2", "node_unhealthy")], NOW)
    assert receiver.bodies("/hook") == []
    r.process([unhealthy("node2")], [], NOW)
    r.process([], [("node2", "node_unhealthy")], NOW)
    states = [b["state"] for b in receiver.bodies("/hook")]
    assert states == ["firing", "resolved"]


def test_storm_of_500_findings_on_200_nodes_is_a_handful_of_alerts(receiver):
    """Standing in for Slack: the local receiver."""
    r = router_for(slack_webhook_url=receiver.url + "/slack")
    storm = [unhealthy(f"node{i % 200:03d}") for i in range(500)]
    r.process(storm, [], NOW)
    msgs = receiver.bodies("/slack")
    assert 1 <= len(msgs) <= 5
    assert "200 nodes" in msgs[0]["text"]
    assert "What to do" in msgs[0]["text"]


def test_pagerduty_trigger_and_resolve_share_a_dedup_key(receiver):
    """Standing in for PagerDuty Events v2: the local receiver."""
    r = router_for(pagerduty_routing_key="k" * 32, pagerduty_url=receiver.url + "/pd")
    r.process([unhealthy("node2")], [], NOW)
    r.process([], [("node2", "node_unhealthy")], NOW)
    trig, res = receiver.bodies("/pd")
    assert trig["event_action"] == "trigger" and res["event_action"] == "resolve"
    assert trig["dedup_key"] == res["dedup_key"]
    assert trig["payload"]["severity"] == "critical" and trig["payload"]["source"] == "node2"


def test_routing_by_severity(receiver):
    r = router_for(
        pagerduty_routing_key="k" * 32,
        pagerduty_url=receiver.url + "/pd",
        webhook_url=receiver.url + "/hook",
    )
    warn = Alert("node1", "lemon_node", "warning", "drained 3 times", "nothing", NOW)
    r.process([warn], [], NOW)
    assert receiver.bodies("/pd") == []  # pages only for critical by default
    assert len(receiver.bodies("/hook")) == 1


def test_a_dead_sink_does_not_block_the_others(receiver):
    r = router_for(
        slack_webhook_url="http://127.0.0.1:9/nowhere",
        webhook_url=receiver.url + "/hook",
        timeout_s=1,
    )
    sent = r.process([unhealthy("node2")], [], NOW)
    assert len(sent) == 1 and len(receiver.bodies("/hook")) == 1


def test_a_delivery_whose_record_cannot_be_written_is_counted_and_logged(receiver, caplog):
    from babysitter.controller.loop.record.alerts.sender import AlertSender

    class RecordFails(MemoryState):
        def upsert_alert(self, key: str, **values: Any) -> None:
            if set(values) == {"sink_results"}:  # the write after the delivery
                raise OSError("database is locked")
            super().upsert_alert(key, **values)

    counted: list[int] = []
    sender = AlertSender(10)
    cfg = parse_config({"alerts": {"webhook_url": receiver.url + "/hook"}})
    r = AlertRouter(
        sinks_from_config(cfg),
        RecordFails(),
        sender=sender,
        on_record_error=lambda: counted.append(1),
    )
    with caplog.at_level("ERROR", logger="babysitter.controller.loop.record.alerts.router"):
        r.process([unhealthy("node2")], [], NOW)
        assert sender.flush()
    sender.close()
    assert len(receiver.bodies("/hook")) == 1  # delivered
    assert counted == [1] and r.record_errors == 1
    assert "node2|node_unhealthy" in r.last_record_error
    assert "could not record the delivery of alert node2|node_unhealthy" in caplog.text


def test_a_long_resolved_alert_is_pruned_and_a_firing_one_kept(tmp_path):
    """Job alerts add a key per job: resolved rows older than retention_days go, so the
    alert table (read by every tick) does not grow for ever; firing rows always stay."""
    from babysitter.controller.db.retention import Retention
    from babysitter.controller.db.store import Store

    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    store.upgrade()
    old = NOW - timedelta(days=40)
    for key, state, resolved in (
        ("node1|node_unhealthy", "firing", None),
        ("job:7|nccl_timeout", "resolved", old),
        ("node2|node_unhealthy", "resolved", NOW - timedelta(days=1)),
    ):
        store.upsert_alert(
            key,
            node=key.split("|")[0],
            condition=key.split("|")[1],
            severity=Severity.WARNING,
            state=state,
            summary="s",
            started_at=old,
            last_sent_at=old,
            resolved_at=resolved,
            sink_results={},
        )
    cfg = parse_config({"controller": {"retention_days": 30}}).controller
    Retention(store, cfg).run_once(now=NOW)
    assert sorted(a["key"] for a in store.alerts()) == [
        "node1|node_unhealthy",
        "node2|node_unhealthy",
    ]
    assert [a["key"] for a in store.firing_alerts()] == ["node1|node_unhealthy"]


def test_a_storms_rows_are_one_write_and_each_node_resolves(db_url):
    """A rack failing alike: every node's alert is recorded (so each can resolve on its own)
    in one statement, not one per node, and so are the resolves; each row is its node's."""
    from sqlalchemy import event

    from babysitter.controller.db.store import Store

    store = Store(db_url)
    store.upgrade()
    writes: list[str] = []
    event.listen(
        store.engine,
        "before_cursor_execute",
        lambda *a: None if a[2].lstrip().upper().startswith("SELECT") else writes.append(a[2]),
    )
    r = AlertRouter([], store, group_threshold=3)
    nodes = [f"node{i}" for i in range(8)]
    r.process([unhealthy(n) for n in nodes], [], NOW)
    assert len(writes) == 1
    firing = {a["key"]: a for a in store.firing_alerts()}
    assert sorted(firing) == sorted(f"{n}|node_unhealthy" for n in nodes)
    assert all(firing[f"{n}|node_unhealthy"]["node"] == n for n in nodes)
    writes.clear()
    later = NOW + timedelta(minutes=5)
    r.process([unhealthy("node0", later)], [(n, "node_unhealthy") for n in nodes[1:]], later)
    assert len(writes) == 1  # node0 is still firing (within its repeat interval): not rewritten
    assert [a["key"] for a in store.firing_alerts()] == ["node0|node_unhealthy"]
    resolved = {a["key"]: a for a in store.alerts() if a["state"] == "resolved"}
    assert all(resolved[f"{n}|node_unhealthy"]["resolved_at"] is not None for n in nodes[1:])
    store.close()
