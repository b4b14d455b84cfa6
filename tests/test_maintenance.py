"""Maintenance windows end to end: a real devcluster, controller and agents, a real
Alertmanager. A window on node2 (opened with the CLI) is a real Slurm MAINT reservation and a
real Alertmanager silence; an XID 79 there neither drains nor pages, the same fault on node3
does; the window ends on its deadline (reservation and silence gone, audited) and node2, still
faulty, is drained then."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from babysitter.cli.when import parse_time
from babysitter.controller.api.maintenance_api import nodes_of
from babysitter.devcluster.receiver import Receiver
from babysitter.devcluster.sim import SimCluster
from tests.fixtures.slurm import node_state, slurm, wait_for

WINDOW_S = 30


@pytest.fixture
def sim(tmp_path: Path, alertmanager: str) -> Iterator[SimCluster]:
    # node2 and node3 both drained in the end: 2 of 3, above the default guard fraction
    s = SimCluster(
        tmp_path / "sim",
        n_nodes=3,
        alertmanager_url=alertmanager,
        policy={"max_drained_fraction": 0.75},
        # and above the default scoped caps (half of the cluster: 1 of 3)
        extra_config={
            "blast_radius": {f"{s}_fraction": 1.0 for s in ("switch", "partition", "cluster")}
        },
    )
    s.up()
    try:
        yield s
    finally:
        s.down()


def cli(sim: SimCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", *args, "--url", sim.url],
        env={"BABYSITTER_TOKEN": sim.admin_token(), "PATH": "/usr/bin:/bin", "HOME": "/tmp"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def silences(am: str) -> list[dict]:
    return [
        s for s in httpx.get(am + "/api/v2/silences").json() if s["status"]["state"] == "active"
    ]


def reservation(sim: SimCluster, name: str) -> str:
    return slurm(sim.info, "scontrol", "show", "reservation", name, check=False).stdout


@pytest.mark.slurm
def test_maintenance_window_holds_back_drain_and_page(sim, alertmanager, receiver: Receiver):
    wait_for(
        lambda: [n["verdict"] for n in sim.api("/api/v1/nodes")] == ["healthy"] * 3,
        60,
        "3 healthy nodes",
    )
    started = cli(
        sim,
        "maintenance",
        "start",
        "node2",
        "--until",
        f"{WINDOW_S}s",
        "--reason",
        "swap PSU",
        "--json",
    )
    assert started.returncode == 0, started.stdout + started.stderr
    window = json.loads(started.stdout)
    assert window["nodes"] == ["node2"] and window["notes"] == []
    res = reservation(sim, window["reservation"])
    assert "Nodes=node2 " in res and "MAINT" in res
    [silence] = silences(alertmanager)
    assert silence["matchers"][0]["name"] == "node" and silence["matchers"][0]["value"] == "node2"
    status = cli(sim, "status")
    assert "maintenance: node2 until" in status.stdout and "swap PSU" in status.stdout

    sim.inject_xid("node2", 3, 79)
    sim.inject_xid("node3", 3, 79)
    wait_for(lambda: node_state(sim.info, "node3")[0] in ("drain", "drng"), 30, "node3 drained")
    wait_for(
        lambda: any(
            a["labels"].get("node") == "node3" for b in receiver.bodies("/am") for a in b["alerts"]
        ),
        30,
        "node3 paged through Alertmanager",
    )
    node2 = sim.api("/api/v1/nodes/node2")
    assert node2["verdict"] == "unhealthy"  # seen and shown ...
    assert not node2["babysitter_drained"]  # ... but not drained
    assert "drain" not in node_state(sim.info, "node2")[0]
    assert not [a for a in sim.api("/api/v1/actions") if a["node"] == "node2"]
    paged = {a["labels"].get("node") for b in receiver.bodies("/am") for a in b["alerts"]}
    assert "node2" not in paged
    am_alerts = httpx.get(alertmanager + "/api/v2/alerts", params={"filter": 'node="node2"'}).json()
    assert am_alerts == []

    # the deadline ends the window by itself: reservation and silence gone, node2 drained
    wait_for(lambda: sim.api("/api/v1/maintenance") == [], WINDOW_S + 15, "the window ended")
    [ended] = sim.api("/api/v1/maintenance?all=true")
    end_at = datetime.fromisoformat(ended["ended_at"])
    deadline = datetime.fromisoformat(ended["ends_at"])
    assert deadline <= end_at, (deadline, end_at)  # by its deadline, never before
    assert "ReservationName" not in reservation(sim, window["reservation"])
    assert silences(alertmanager) == []
    wait_for(lambda: node_state(sim.info, "node2")[0] in ("drain", "drng"), 30, "node2 drained")
    audit = sim.api("/api/v1/audit?node=node2")
    kinds = [(e["kind"], e["actor"], e["result"]) for e in audit]
    assert ("maintenance_end", "maintenance", "done") in kinds
    assert any(k[0] == "maintenance_start" and k[1].startswith("admin") for k in kinds)


def test_hostlists_and_deadlines_on_the_command_line():
    assert nodes_of("node[2-3],gpu01") == ["gpu01", "node2", "node3"]
    for bad in ("node[3-1]", "node[1-2", "../etc", ""):
        with pytest.raises(ValueError):
            nodes_of(bad)
    now = datetime(2026, 11, 26, 4, 0, tzinfo=UTC)
    assert parse_time("90m", now, past=False) == datetime(2026, 11, 26, 5, 30, tzinfo=UTC)


def test_self_healing_leaves_nodes_in_maintenance_alone(tmp_path, monkeypatch):
    """A node babysitter drained before an admin opened a window on it: no remediation rung
    (GPU reset, reboot) starts there while the window is open; the other held node's does."""
    from types import SimpleNamespace

    from babysitter.config import parse_config
    from babysitter.controller.db.store import Store
    from babysitter.controller.loop.heal.healer import Healer
    from babysitter.controller.loop.read.context import LoopContext

    store = Store(f"sqlite:///{tmp_path / 'h.db'}")
    store.upgrade()
    snapshot = SimpleNamespace(ok=True, held={"node1", "node2"}, nodes={})
    cfg = parse_config({"remediation": {"enabled": True}})
    ctx = LoopContext(cfg, store, None, snapshot)  # type: ignore[arg-type]
    healer = Healer(ctx, None, False)  # type: ignore[arg-type]
    started: list[str] = []
    # both held nodes are babysitter's drains with a fault (their findings in one read)
    monkeypatch.setattr(healer, "_startable", lambda sn: True)
    monkeypatch.setattr(
        "babysitter.controller.loop.heal.healer.open_findings",
        lambda store, names: {n: [] for n in names},
    )
    monkeypatch.setattr(
        "babysitter.controller.loop.heal.healer.start",
        lambda h, node, findings, now, firing, batch: started.append(node),
    )
    healer.quiet = {"node2"}
    healer.step(datetime.now(UTC), [], [])
    assert started == ["node1"]
    store.close()


def test_a_failed_maintenance_read_holds_instead_of_ending_every_window(tmp_path, monkeypatch):
    """The windows cannot be read (the database is locked, say): the nodes last known in
    maintenance stay quiet (not drained, not rebooted, not paged), no new automatic action
    starts anywhere, and on-call is told; once the read works the loop goes on."""
    from datetime import timedelta

    from tests.fixtures.healing import Cluster, xid79

    c = Cluster(tmp_path, nodes=3)
    c.engine.maintenance.start(["node2"], "node2", c.now + timedelta(hours=2), "swap PSU", "admin")
    c.tick()

    def unreadable(at=None):
        raise RuntimeError("database is locked")

    with monkeypatch.context() as m:
        m.setattr(c.engine.maintenance, "expire", unreadable)
        c.report("node2", xid79())
        c.report("node3", xid79())
        for _ in range(3):
            c.tick()
        assert not any(c.slurm.node(n).drained_or_draining for n in c.names)
        assert not [op for op, _ in c.slurm.calls if op in ("reboot", "drain", "drain_many")]
        firing = c.engine.router.firing_keys()
        assert "cluster|maintenance_unknown" in firing
        assert not [k for k in firing if k.startswith("node2|")]  # node2 is not paged
    c.tick()
    c.tick()
    assert c.slurm.node("node3").drained_or_draining  # the read works again: node3's fault
    assert not c.slurm.node("node2").drained_or_draining  # node2's window is still open
    assert "cluster|maintenance_unknown" not in c.engine.router.firing_keys()
    c.close()


def test_ending_one_node_shrinks_its_window_and_no_reservation_outlives_the_windows(tmp_path):
    """`maintenance end node5` on a node[1-8] window: node5 alone leaves it (and its Slurm
    reservation); the others stay in maintenance. Overlapping windows each let go of the node;
    a window with no node left ends, and a reservation Slurm would not delete at first is
    deleted later, never left behind."""
    from datetime import timedelta

    from tests.fixtures.healing import Cluster

    c = Cluster(tmp_path, nodes=8)
    maint = c.engine.maintenance
    until = c.now + timedelta(hours=2)
    big = maint.start(c.names, "node[1-8]", until, "rack work", "admin")
    small = maint.start(["node5", "node6"], "node[5-6]", until, "PSU", "admin")
    assert set(c.slurm.reservations) == {big.reservation, small.reservation}

    (w1, w2) = sorted(maint.end(["node5"], "admin"), key=lambda w: w.id)
    assert w1.state == "active" and "node5" not in w1.nodes and len(w1.nodes) == 7
    assert c.slurm.reservations[big.reservation] == w1.nodes
    assert w2.state == "active" and w2.nodes == ("node6",)
    c.tick()
    assert c.engine._quiet == set(c.names) - {"node5"}  # babysitter watches node5 again

    c.slurm.unreachable = True  # slurmctld away when the last node leaves the small window
    (w2,) = [w for w in maint.end(["node6"], "admin") if w.id == small.id]
    assert w2.state == "ended" and small.reservation in c.slurm.reservations
    c.slurm.unreachable = False
    maint.expire(c.now)
    assert set(c.slurm.reservations) == {big.reservation}  # deleted once Slurm answered
    maint.end(c.names, "admin")
    assert c.slurm.reservations == {}
    c.close()
