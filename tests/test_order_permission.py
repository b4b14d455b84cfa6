"""Orders that cannot outlive their permission (issue 49, side door 3): a GPU reset order
handed out after an admin opened a maintenance window on the node, a replayed order, an
expired order, an order for another node, RMA evidence for a node in maintenance or someone
else's.

End to end: the remediation engine over the in-memory Slurm (tests/fixtures/healing.py), the
controller's API serving its real order book on a local port, and the real agent as a
process of its own on simulated GPUs (the fake libnvidia-ml), running the site's reset command
(here: a line appended to a file, one per reset)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from babysitter.controller.api.orders import OrderBook
from babysitter.controller.db import models as m
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.heal import rma
from babysitter.controller.loop.read.ledger import Ledger, Phase, Remediation
from babysitter.controller.runtime import Controller
from babysitter.devcluster.fakenvml import FakeGpus
from babysitter.finding import Finding
from tests.fixtures.controller import Secrets, controller_config, set_up
from tests.fixtures.gpu import babysitter_env
from tests.fixtures.healing import Cluster
from tests.fixtures.slurm import wait_for
from tests.test_rma_evidence import served

BUS = "0000:5d:00"  # the fake GPU 3's PCI address, as the kernel log spells it


def xid48() -> Finding:
    """A reset-class XID on GPU 3, named by its bus id (the kernel log's XID line)."""
    return Finding(
        check="gpu.xid",
        component="gpu3",
        severity="critical",
        code="xid.48",
        message="XID 48 on GPU 3: double-bit ECC error",
        action="reset_gpu",
        details={"pci_bus_id": BUS},
    )


def _reset_ordered(c: Cluster) -> Remediation:
    c.tick()
    c.report("node1", xid48())
    c.tick()
    c.tick()
    (row,) = c.ledger("node1")
    assert row.state is Phase.RESETTING and row.evidence.get("order_id"), row
    return row


def _orders(book: OrderBook, node: str) -> list[dict[str, Any]]:
    book.refresh()
    part = book.answer_part(node)
    return json.loads(part[len(b',"orders":') :]) if part else []


@dataclass
class Node1:
    """node1's real agent, restartable, against the served controller."""

    env: dict[str, str]
    log: Path
    resets: Path  # one line per reset the site's command ran
    store: Any
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> int:
        """Start the agent; returns how many reports of node1 the controller had before."""
        before = self.reports()
        with self.log.open("ab") as out:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "babysitter.cli.main", "agent"],
                    env=self.env,
                    stdout=out,
                    stderr=out,
                )
            )
        return before

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)

    def reports(self) -> int:
        with self.store.engine.connect() as c:
            q = select(func.count()).select_from(m.reports).where(m.reports.c.node == "node1")
            return int(c.execute(q).scalar() or 0)

    def reset_count(self) -> int:
        return len(self.resets.read_text().splitlines()) if self.resets.exists() else 0

    def answered_reports_since(self, before: int, n: int) -> bool:
        """n reports stored since `before`: the agent has taken the answers to the first ones
        (the shipper hands an answer's orders over before it sends the next report)."""
        return self.reports() >= before + n


@contextmanager
def node1_agent(
    tmp_path: Path, secrets: Secrets, gpus: FakeGpus, lib: Path
) -> Iterator[tuple[Cluster, Controller, Node1]]:
    c = Cluster(tmp_path)
    cfg = controller_config(
        secrets, f"sqlite:///{tmp_path / 'heal.db'}", remediation={"enabled": True}
    )
    with set_up(cfg) as ctl, served(ctl.app()) as url:
        assert ctl.orders is not None
        ctl.orders.start()  # the book every replica runs: re-read once a second
        resets = tmp_path / "resets"
        env = babysitter_env(
            gpus,
            lib,
            tmp_path,
            agent__controller_url=url,
            agent__node_name="node1",
            agent__token_file=str(secrets.node_token_file("node1")),
            agent__spool_path=str(tmp_path / "spool.db"),
            agent__interval_s="0.5",
            agent__request_timeout_s="5",
            agent__enabled_checks='["host.resources"]',
            agent__gpu_reset_command=json.dumps(["sh", "-c", f"echo {{bus_id}} >> {resets}"]),
        )
        agent = Node1(env, tmp_path / "agent.log", resets, c.store)
        try:
            yield c, ctl, agent
        finally:
            agent.stop()
            ctl.orders.stop()
            c.close()


def _answer_in(c: Cluster, order_id: str) -> bool:
    got = ((c.store.node("node1") or {}).get("metrics") or {}).get("gpu_reset")
    return isinstance(got, dict) and got.get("order") == order_id and bool(got.get("ok"))


def _reset_taken(c: Cluster, agent: Node1, order_id: str) -> None:
    """The agent takes the order from an answer, resets GPU 3 once and answers."""
    agent.start()
    wait_for(lambda: agent.reset_count() >= 1, 90, "the agent's GPU reset")
    wait_for(lambda: _answer_in(c, order_id), 60, "the reset's answer at the controller")
    agent.stop()


def test_a_real_agent_restarted_inside_a_maintenance_window_does_not_reset_the_gpu(
    tmp_path: Path, secrets: Secrets, gpus: FakeGpus, fakenvml_lib: Path
):
    """The reset is ordered and carried out; before the healer has taken the answer, an admin
    opens a window on the node (the healer takes no step there). The order is not handed out
    any more, and the agent, restarted inside the window, does not reset the GPU again. Once
    the window ends the healer takes the answer the restarted agent still reports."""
    with node1_agent(tmp_path, secrets, gpus, fakenvml_lib) as (c, ctl, agent):
        row = _reset_ordered(c)
        order_id = row.evidence["order_id"]
        _reset_taken(c, agent, order_id)
        c.engine.maintenance.start(["node1"], "node1", c.now + timedelta(hours=2), "cable", "al")
        c.tick()
        (row,) = c.ledger("node1")
        assert row.state is Phase.RESETTING and "reset_done_at" not in row.evidence  # untouched
        book = ctl.orders
        assert book is not None
        wait_for(lambda: book.answer_part("node1") == b"", 30, "the order withdrawn")

        before = agent.start()  # restarted inside the window
        wait_for(
            lambda: agent.answered_reports_since(before, 4) or agent.reset_count() > 1,
            90,
            "the restarted agent's reports answered",
        )
        assert agent.reset_count() == 1, "GPU reset again inside the maintenance window"

        c.engine.maintenance.end(["node1"], "al")
        c.tick()
        (row,) = c.ledger("node1")
        assert "reset_done_at" in row.evidence, row  # the answer survived the agent's restart
        assert agent.reset_count() == 1


def test_a_replayed_order_is_not_carried_out_twice(
    tmp_path: Path, secrets: Secrets, gpus: FakeGpus, fakenvml_lib: Path
):
    """The controller repeats an order until its healer takes the answer. An agent restarted
    in between gets the same order again: it remembers (on disk) that it took it."""
    with node1_agent(tmp_path, secrets, gpus, fakenvml_lib) as (c, ctl, agent):
        row = _reset_ordered(c)
        order_id = row.evidence["order_id"]
        _reset_taken(c, agent, order_id)
        assert ctl.orders is not None
        # no tick since the answer: the order is still handed out, the same id
        assert [o["id"] for o in _orders(ctl.orders, "node1")] == [order_id]

        before = agent.start()
        wait_for(
            lambda: agent.answered_reports_since(before, 4) or agent.reset_count() > 1,
            90,
            "the restarted agent's reports answered",
        )
        assert agent.reset_count() == 1, "a replayed order reset the GPU again"
        assert f"order {order_id} (gpu.reset) was taken before" in agent.log.read_text()
        assert [o["id"] for o in _orders(ctl.orders, "node1")] == [order_id]  # still offered
        c.tick()  # the healer takes the answer: the order is over
        assert _orders(ctl.orders, "node1") == []


# ---- expiry


def test_an_expired_order_is_not_handed_out_and_times_out_inside_a_window(tmp_path: Path):
    c = Cluster(tmp_path)
    row = _reset_ordered(c)
    issued = datetime.fromisoformat(row.evidence["issued_at"])
    at = {"t": issued}
    book = OrderBook(c.store, sdc=False, clock=lambda: at["t"].timestamp())
    (order,) = _orders(book, "node1")
    # bound to its node, its episode and the reset timeout from when it was issued
    assert (order["node"], order["episode"]) == ("node1", row.id)
    assert datetime.fromisoformat(order["expires_at"]) == issued + timedelta(seconds=300)
    at["t"] = issued + timedelta(seconds=301)
    assert book.answer_part("node1") == b""  # checked at the hand-out, not at the refresh

    # a window opens; the healer takes no step there, but the order still expires
    c.engine.maintenance.start(["node1"], "node1", c.now + timedelta(hours=2), "bios", "al")
    mark = len(c.slurm.calls)
    c.tick(60)
    assert c.ledger("node1")[0].state is Phase.RESETTING  # not expired yet
    c.tick(300)
    (row,) = c.ledger("node1")
    assert row.state is Phase.TIMED_OUT and not row.open and "maintenance" in row.outcome
    assert c.calls_after(mark, "node1") == []  # no drain, no reboot of the admin's node
    failed = [a for a in c.store.actions() if a.status is ActionStatus.FAILED]
    assert [(a.kind, a.node) for a in failed] == [(ActionKind.RESET_GPU, "node1")]
    assert _orders(OrderBook(c.store, sdc=False), "node1") == []

    # after the window the healer starts afresh from the node's open fault: a new order
    c.engine.maintenance.end(["node1"], "al")
    c.tick()
    c.tick()
    new = c.ledger("node1")[0]
    assert new.state is Phase.RESETTING and new.evidence["order_id"] != order["id"]
    c.close()


def _agent(tmp_path: Path, secrets: Secrets, url: str) -> Any:
    """node1's real agent in this process, its shipper sending to `url`."""
    from babysitter.agent.daemon import Agent
    from babysitter.config import parse_config

    cfg = parse_config(
        {
            "agent": {
                "node_name": "node1",
                "controller_url": url,
                "token_file": str(secrets.node_token_file("node1")),
                "spool_path": str(tmp_path / "spool.db"),
                "enabled_checks": ["host.resources"],
                "gpu_reset_command": ["sh", "-c", f"echo {{bus_id}} >> {tmp_path / 'resets'}"],
            },
            "checks": {"host": {"check_slurmd": False, "min_free_gb": 0}},
        }
    )
    agent = Agent(cfg)
    agent.shipper.start()
    return agent


def _refused(store: Any) -> list[tuple[str, str]]:
    """(order, why) of each refusal node1's agent reported, in order."""
    t = m.reports
    with store.engine.connect() as c:
        rows = c.execute(select(t.c.metrics).where(t.c.node == "node1").order_by(t.c.id))
        return [
            (r["order_refused"]["order"], r["order_refused"]["why"])
            for (r,) in rows
            if r and "order_refused" in r
        ]


def test_the_agent_refuses_an_expired_order_and_another_nodes(tmp_path: Path, secrets: Secrets):
    from babysitter.agent.order_gate import CLOCK_SKEW_S

    cfg = controller_config(secrets, f"sqlite:///{tmp_path / 'c.db'}")
    with set_up(cfg) as ctl, served(ctl.app()) as url:
        agent = _agent(tmp_path, secrets, url)
        now = datetime.now(UTC)
        late = (now - timedelta(seconds=CLOCK_SKEW_S + 60)).isoformat()
        base = {"check": "gpu.reset", "bus_id": BUS, "episode": 7}
        agent.take_orders(
            [
                {**base, "id": "expired", "node": "node1", "expires_at": late},
                {**base, "id": "for-node2", "node": "node2", "expires_at": now.isoformat()},
            ]
        )
        wait_for(lambda: len(_refused(ctl.store)) == 2, 30, "the agent's refusals")
        agent.shipper.stop()
        got = dict(_refused(ctl.store))
        assert "the order expired" in got["expired"]
        assert got["for-node2"] == "the order is for node node2, this is node1"
        assert not (tmp_path / "resets").exists() and agent.reset_outcome is None

        # handed again to an agent restarted since: taken before, neither run nor answered
        again = _agent(tmp_path, secrets, url)
        again.take_orders([{**base, "id": "expired", "node": "node1", "expires_at": late}])
        marker = again.full_report()
        again.shipper.submit(marker)  # shipped after anything take_orders sent
        wait_for(lambda: marker["report_id"] in ctl.store.report_ids(), 30, "the marker report")
        again.shipper.stop()
        assert len(_refused(ctl.store)) == 2 and not (tmp_path / "resets").exists()


# ---- binding: an order reaches its own node only


def _post(client: TestClient, secrets: Secrets, token_of: str, node: str) -> Any:
    body = {
        "node": node,
        "report_id": str(uuid.uuid4()),
        "sent_at": datetime.now(UTC).isoformat(),
        "findings": [],
        "metrics": {},
    }
    return client.post("/api/v1/reports", json=body, headers=secrets.headers(token_of))


def test_an_order_for_node1_never_reaches_node2(tmp_path: Path, secrets: Secrets):
    c = Cluster(tmp_path)
    row = _reset_ordered(c)
    cfg = controller_config(
        secrets, f"sqlite:///{tmp_path / 'heal.db'}", remediation={"enabled": True}
    )
    with set_up(cfg) as ctl:
        assert ctl.orders is not None
        ctl.orders.refresh()
        client = TestClient(ctl.app())
        mine = _post(client, secrets, "node1", "node1")
        assert [o["id"] for o in mine.json()["orders"]] == [row.evidence["order_id"]]
        assert mine.json()["orders"][0]["node"] == "node1"
        theirs = _post(client, secrets, "node2", "node2")
        assert theirs.status_code == 202 and "orders" not in theirs.json()
        # node2's token cannot report as node1 (and so get its answer)
        assert _post(client, secrets, "node2", "node1").status_code == 403
    c.close()


# ---- RMA evidence


def test_rma_evidence_is_not_ordered_for_a_node_in_maintenance_or_someone_elses(tmp_path: Path):
    c = Cluster(tmp_path, nodes=3)
    c.tick()
    c.engine.maintenance.start(["node1"], "node1", c.now + timedelta(hours=2), "psu", "al")
    c.slurm.admin_drain("node2", "bad riser -- al")
    c.tick()  # the loop mirrors node2's Slurm reason into its row
    ledger = Ledger(c.store)
    for n in ("node1", "node2"):
        ledger.add(n, Rung.INSPECT, "xid.79", "x", Phase.LEMON, c.now)
    c.tick()
    assert rma.archives(c.store) == []
    c.engine.maintenance.end(["node1"], "al")
    c.tick()
    assert [a.node for a in rma.archives(c.store)] == ["node1"]

    # ordered for node3, then an admin takes node3 over: the order is not handed out
    ledger.add("node3", Rung.INSPECT, "xid.79", "x", Phase.LEMON, c.now)
    c.tick()
    book = OrderBook(c.store, sdc=False)
    assert [o["check"] for o in _orders(book, "node3")] == ["rma.collect"]
    c.slurm.admin_drain("node3", "swapping the GPU board -- al")
    c.tick()
    assert _orders(book, "node3") == []
    c.close()
