"""Alert delivery of the remediation loop: a real Alertmanager (resolve_timeout 10 s) keeps a
broken node's alert firing as long as it is broken, and a webhook that never answers does not
hold up drains (the sender runs on its own thread)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from babysitter.config import parse_config
from babysitter.controller.db.store import Store
from babysitter.controller.loop.remediation import make_engine
from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.slurm import node_state, wait_for
from tests.test_remediation import XID79, send

BROKEN_S = 60


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'a.db'}")
    s.upgrade()
    yield s
    s.close()


def am_alerts(am: str, node: str) -> list[dict]:
    r = httpx.get(am + "/api/v2/alerts", params={"filter": f'node="{node}"'}, timeout=5)
    return [a for a in r.json() if a["labels"]["condition"] == "node_unhealthy"]


def resolved_unhealthy(receiver) -> bool:
    return any(
        a["status"] == "resolved" and a["labels"]["condition"] == "node_unhealthy"
        for b in receiver.bodies("/am")
        for a in b["alerts"]
    )


def test_broken_node_stays_firing_in_alertmanager_then_resolves_in_one_tick(
    clean_cluster, store, alertmanager, receiver
):
    cfg = parse_config(
        {
            "policy": {"max_drained_fraction": 0.5, "resume_after_clean_checks": 1},
            "slurm": {"slurm_conf": clean_cluster.slurm_conf},
            # re-send every 3 s with endsAt 12 s ahead: both well inside the 60 s test, so it
            # shows the refresh at work, not a long endsAt
            "alerts": {"alertmanager_url": alertmanager, "alertmanager_resend_s": 3},
        }
    )
    eng = make_engine(cfg, store, slurm=CliSlurmClient(slurm_conf=Path(clean_cluster.slurm_conf)))
    try:
        for n in clean_cluster.nodes:
            send(store, n)
        send(store, "node2", XID79)
        eng.tick()
        assert eng.sender.flush()
        assert node_state(clean_cluster, "node2")[0] == "drain"
        start = time.monotonic()
        while time.monotonic() - start < BROKEN_S:
            send(store, "node2", XID79)  # the agent keeps reporting the fault
            eng.tick()
            assert eng.sender.flush()
            [a] = am_alerts(alertmanager, "node2")
            assert a["status"]["state"] == "active", a
            time.sleep(1)
        assert not resolved_unhealthy(receiver), "resolved while the node was still broken"

        send(store, "node2")  # recovered
        eng.tick()  # one tick: resume, and the resolve is posted
        assert eng.sender.flush()
        assert node_state(clean_cluster, "node2")[0] in ("idle", "resume")
        assert am_alerts(alertmanager, "node2") == [] or all(
            a["status"]["state"] != "active" for a in am_alerts(alertmanager, "node2")
        )
        wait_for(
            lambda: resolved_unhealthy(receiver),
            15,
            "resolved notification",
        )
    finally:
        eng.close()


def test_a_webhook_that_never_answers_does_not_hold_up_drains(clean_cluster, store):
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # the kernel accepts the connection; nobody ever answers
    cfg = parse_config(
        {
            "policy": {"max_drained_fraction": 1.0},
            # three of the four nodes drain: no scope capped at its default half
            "blast_radius": dict.fromkeys(
                ("switch_fraction", "partition_fraction", "cluster_fraction"), 1.0
            ),
            "slurm": {"slurm_conf": clean_cluster.slurm_conf},
            "alerts": {
                "webhook_url": f"http://127.0.0.1:{hole.getsockname()[1]}/hook",
                "timeout_s": 30,
                "queue_size": 1,
            },
        }
    )
    eng = make_engine(cfg, store, slurm=CliSlurmClient(slurm_conf=Path(clean_cluster.slurm_conf)))
    try:
        for n in clean_cluster.nodes:
            send(store, n)
        for node in ("node1", "node2", "node3"):
            send(store, node, XID79)
            eng.tick()
            # drained in the same tick, while the first alert still waits on the black hole
            assert node_state(clean_cluster, node)[0] == "drain"
            assert not eng.sender.flush(timeout_s=0)
        # queue of 1: one delivery in flight, one queued, the rest dropped and counted
        dropped = eng.metrics.registry.get_sample_value("babysitter_alerts_dropped_total")
        assert dropped is not None and dropped >= 1
    finally:
        eng.close()
        hole.close()
