"""The blast-radius guard as a new site runs it: a real controller process with the DEFAULT
policy (max_drained_fraction 0.1, min_drainable 1) on the 4-node devcluster."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from babysitter.controller.loop.decide.node.rules import Rule
from tests.fixtures.controller import ControllerProcess, controller_config, free_port
from tests.fixtures.slurm import node_state, wait_for
from tests.test_leader import post_fault


def guard(ctl: ControllerProcess, secrets) -> dict:
    r = httpx.get(
        ctl.url + "/api/v1/guard", timeout=5, headers={"Authorization": f"Bearer {secrets.read}"}
    )
    r.raise_for_status()
    return r.json()


def status_json(ctl: ControllerProcess, secrets) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", "status", "--json", "--url", ctl.url],
        env={**ctl.env, "BABYSITTER_TOKEN": secrets.admin},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def start(secrets, tmp_path, cluster, receiver) -> ControllerProcess:
    cfg = controller_config(
        secrets,
        f"sqlite:///{tmp_path / 'g.db'}",
        port=free_port(),
        alerts={"webhook_url": receiver.url + "/hook"},
    )
    env = {"BABYSITTER_SLURM__SLURM_CONF": cluster.slurm_conf}
    # generous: eight test runs share two cores here
    return ControllerProcess(cfg, env=env, log=tmp_path / "ctl.log").start(timeout=90)


def conditions(receiver) -> list[tuple[str, str]]:
    return [(b["condition"], b["state"]) for b in receiver.bodies("/hook")]


def test_default_policy_drains_first_fault_then_guard_holds_the_second(
    clean_cluster, secrets, tmp_path, receiver
):
    ctl = start(secrets, tmp_path, clean_cluster, receiver)
    try:
        wait_for(lambda: guard(ctl, secrets).get("slurm_data") is True, 30, "guard sized")
        g = guard(ctl, secrets)
        assert g["state"] == "armed" and g["partitions"]["gpu"]["may_drain"] == 1
        post_fault(ctl, secrets, "node2")
        wait_for(lambda: node_state(clean_cluster, "node2")[0] == "drain", 30, "node2 drained")
        assert not guard(ctl, secrets)["tripped"]

        # a second concurrent fault in the 4-node partition: max(1, 10 % x 4) = 1 already
        # drained, so it is held back, the breaker trips and on-call is told why
        post_fault(ctl, secrets, "node3")
        wait_for(lambda: guard(ctl, secrets)["tripped"], 30, "guard tripped")
        g = guard(ctl, secrets)
        assert g["rule"] == "guard_fraction" and g["blocked"] == ["node3"]
        assert g["rule_description"] == Rule.GUARD_FRACTION.description
        assert "NOT drained" in g["reason"] and g["since"]
        assert node_state(clean_cluster, "node3")[0] == "idle"
        wait_for(lambda: ("guard_tripped", "firing") in conditions(receiver), 15, "alert")
        st = status_json(ctl, secrets)
        assert st["guard"]["tripped"] and st["guard"]["reason"] == g["reason"]
    finally:
        ctl.stop()


def test_slurm_down_at_start_decides_nothing_alerts_and_never_trips(
    clean_cluster, devcluster_obj, secrets, tmp_path, receiver
):
    devcluster_obj.stop_slurmctld()
    try:
        ctl = start(secrets, tmp_path, clean_cluster, receiver)
        post_fault(ctl, secrets, "node2")
        wait_for(
            lambda: ("guard_sizes_unknown", "firing") in conditions(receiver),
            30,
            "an alert that partition sizes are unknown",
        )
        g = guard(ctl, secrets)
        assert not g["tripped"] and g["state"] == "undecided" and g["undecided"] == ["node2"]
        assert g["slurm_data"] is False
    finally:
        devcluster_obj.start_slurmctld()
    try:
        wait_for(lambda: node_state(clean_cluster, "node2")[0] == "drain", 60, "drained later")
        wait_for(lambda: guard(ctl, secrets)["state"] == "armed", 30, "guard armed")
        assert not guard(ctl, secrets)["tripped"]
        wait_for(
            lambda: ("guard_sizes_unknown", "resolved") in conditions(receiver), 15, "resolved"
        )
    finally:
        ctl.stop()
