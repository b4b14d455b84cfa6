"""`systemctl reload babysitter-*` (SIGHUP): the daemons re-read their config file, apply what
may change live, name what needs a restart, and keep the old configuration when the new file is
invalid (log, metric, alert). The process tests run the real daemons and send the real signal;
what changed is read from their API, their metrics and the controller's view of the node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from babysitter.config import load_config, parse_config
from babysitter.devcluster.receiver import Receiver
from babysitter.reload import (
    AGENT_RESTART,
    AGENT_UNUSED,
    CONTROLLER_RESTART,
    CONTROLLER_UNUSED,
    apply,
    reload,
)
from tests.fixtures.controller import Secrets, free_port
from tests.fixtures.slurm import wait_for

# ---- what a reload applies (in-process)


def test_live_keys_are_applied_in_place_and_the_rest_is_named():
    live = parse_config({"policy": {"max_drains_per_hour": 20}, "checks": {"host": {}}})
    policy = live.policy  # what the loop's objects hold: the same object after the reload
    new = parse_config(
        {
            "controller": {"listen": "127.0.0.1:9999", "loop_interval_s": 2},
            "policy": {"max_drains_per_hour": 5},
            "alerts": {"webhook_url": "http://127.0.0.1:1/hook"},
            "slurm": {"reason_prefix": "bs:"},
        }
    )
    out = apply(live, new, CONTROLLER_RESTART, CONTROLLER_UNUSED)
    assert out.ok
    assert sorted(out.applied) == [
        "alerts.webhook_url",
        "controller.loop_interval_s",
        "policy.max_drains_per_hour",
    ]
    assert sorted(out.needs_restart) == ["controller.listen", "slurm.reason_prefix"]
    assert live.policy is policy and policy.max_drains_per_hour == 5
    assert live.alerts.webhook_url == "http://127.0.0.1:1/hook"
    assert live.controller.listen != "127.0.0.1:9999"  # not applied: a restart takes it
    assert "needs restart: controller.listen, slurm.reason_prefix" in out.summary()


def test_the_agent_takes_thresholds_and_intervals_not_its_identity_or_its_checks():
    live = parse_config({"agent": {"node_name": "node1"}})
    new = parse_config(
        {
            "agent": {"node_name": "node2", "interval_s": 7},
            "checks": {"host": {"min_free_gb": 3, "enabled": False}},
            "policy": {"max_drains_per_hour": 1},  # the controller's: not the agent's to list
        }
    )
    out = apply(live, new, AGENT_RESTART, AGENT_UNUSED)
    assert sorted(out.applied) == ["agent.interval_s", "checks.host.min_free_gb"]
    assert sorted(out.needs_restart) == ["agent.node_name", "checks.host.enabled"]
    assert live.agent.interval_s == 7 and live.checks.host.min_free_gb == 3
    assert live.agent.node_name == "node1" and live.checks.host.enabled


def test_an_invalid_file_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for k in [k for k in os.environ if k.startswith("BABYSITTER_")]:
        monkeypatch.delenv(k)
    live = parse_config({"checks": {"host": {"min_free_gb": 1}}})
    f = tmp_path / "b.toml"
    f.write_text("[checks.host]\nmin_free_gb = 50\nmin_free_gib = 2\n")  # a misspelled key
    out = reload(live, f, AGENT_RESTART, AGENT_UNUSED)
    assert not out.ok and "min_free_gib" in out.error
    assert live.checks.host.min_free_gb == 1
    f.write_text("[checks.host\n")  # not TOML
    out = reload(live, f, AGENT_RESTART, AGENT_UNUSED)
    assert not out.ok and "not valid TOML" in out.error
    assert out.summary().startswith("configuration reload refused, the previous configuration")


def test_the_policy_loop_takes_the_reloaded_thresholds_caps_and_sinks(tmp_path: Path):
    """What the engine copied at start (policy settings, admission caps, alert sinks) follows
    a reload; everything else reads the config, which the reload wrote into."""
    from unittest import mock

    from babysitter.controller.db.store import Store
    from babysitter.controller.loop.record.metrics import ControllerMetrics
    from babysitter.controller.loop.remediation import RemediationEngine

    live = parse_config({"controller": {"database_url": f"sqlite:///{tmp_path / 'b.db'}"}})
    store = Store(live.controller.database_url)
    store.upgrade()
    engine = RemediationEngine(live, store, ControllerMetrics(), slurm=mock.MagicMock())
    try:
        assert engine.router.sinks == []
        new = parse_config(
            {
                "controller": {"database_url": live.controller.database_url},
                "policy": {"max_drains_per_hour": 3, "dry_run": True},
                "blast_radius": {"switch_count": 2},
                "alerts": {"webhook_url": "http://127.0.0.1:1/hook"},
            }
        )
        out = apply(live, new, CONTROLLER_RESTART, CONTROLLER_UNUSED)
        assert out.ok and not out.needs_restart
        engine.config_reloaded(None)
        assert engine.settings.max_drains_per_hour == 3 and engine.healer.dry_run
        assert engine.gatherer.settings is engine.settings
        assert engine.admission.limits.max_drains_per_hour == 3
        assert engine.admission.limits.blast.switch.count == 2
        assert [s.name for s, _ in engine.router.sinks] == ["webhook"]
        # refused: the alert condition holds until a good reload
        engine.config_reloaded("invalid configuration in f: policy.dry_run: bad")
        assert engine.config_problem is not None
        engine.config_reloaded(None)
        assert engine.config_problem is None
    finally:
        engine.close()
        store.close()


def test_the_policy_loop_takes_the_reloaded_ladder_validation_and_alertmanager(tmp_path: Path):
    """Keys a reload says it applied are in effect in the objects that copied them at start:
    the remediation ladder, validation turned on (its poll runs, else validating nodes wait
    for ever), the validation job's time, the maintenance windows' Alertmanager."""
    from unittest import mock

    from babysitter.controller.db.store import Store
    from babysitter.controller.loop.decide.ladder import Rung
    from babysitter.controller.loop.record.metrics import ControllerMetrics
    from babysitter.controller.loop.remediation import RemediationEngine
    from babysitter.finding import Action

    url = f"sqlite:///{tmp_path / 'b.db'}"
    live = parse_config({"controller": {"database_url": url}})
    store = Store(url)
    store.upgrade()
    engine = RemediationEngine(live, store, ControllerMetrics(), slurm=mock.MagicMock())
    try:
        assert not engine.validator.enabled and engine.maintenance.am is None
        new = parse_config(
            {
                "controller": {"database_url": url},
                "remediation": {"ladder": {"xid.79": ["rma"]}, "reset_timeout_s": 77},
                "policy": {"lemon_drains": 9},
                "checks": {"sdc": {"max_slurm_rpc_per_s": 0.25}},
                "validation": {"partition": "validate", "time_limit_min": 40},
                "alerts": {"alertmanager_url": "http://127.0.0.1:1"},
            }
        )
        out = apply(live, new, CONTROLLER_RESTART, CONTROLLER_UNUSED)
        assert out.ok and not out.needs_restart and "remediation.ladder" in out.applied
        engine.config_reloaded(None)
        assert engine.healer.ladder.first("xid.79", Action.REBOOT) is Rung.RMA
        assert engine.validator.enabled
        assert engine.healer.validation_minutes == 45
        assert engine.healer.lemon_drains[0] == 9 and engine.healer.fabric_rung.timeout_s == 77
        assert engine.sdc.rpc.rate == 0.25
        assert (
            engine.maintenance.am is not None and engine.maintenance.am.base == "http://127.0.0.1:1"
        )
        # turned off again: validations already submitted are still polled to their end
        apply(live, parse_config({"controller": {"database_url": url}}), CONTROLLER_RESTART)
        engine.config_reloaded(None)
        assert engine.validator.enabled and not engine.settings.validate_before_resume
    finally:
        engine.close()
        store.close()


def test_a_reloaded_loop_interval_moves_the_status_pages_stale_mark(
    secrets: Secrets, tmp_path: Path
):
    """loop_interval_s is live: the status page, rebuilt once a tick, must not call a page of
    a slower loop out of date (nor rebuild it less often than a tick of a faster one)."""
    from babysitter.controller.runtime import Controller

    port = free_port()
    path = tmp_path / "controller.toml"
    path.write_text(_controller_toml(secrets, tmp_path / "c.db", port, "http://127.0.0.1:1/h", 60))
    ctl = Controller(load_config(path), path)
    try:
        path.write_text(
            _controller_toml(secrets, tmp_path / "c.db", port, "http://127.0.0.1:1/h", 60).replace(
                "loop_interval_s = 0.2", "loop_interval_s = 120"
            )
        )
        out = ctl.reload_config()
        assert out.ok and "controller.loop_interval_s" in out.applied
        assert ctl.fleet.stale_after_s >= 4 * 120
    finally:
        ctl.close()


# ---- the daemons, SIGHUP for real


def _clean_env(**extra: str) -> dict[str, str]:
    """The settings come from the file alone (a BABYSITTER_* variable would win over it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BABYSITTER_")}
    env.update(extra)
    return env


def _spawn(command: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "babysitter.cli.main", command, "--config", str(config)],
            env=_clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def _metric(url: str, sample: str) -> float | None:
    """One sample's value from a Prometheus text page (None while absent or unreachable)."""
    try:
        text = httpx.get(url, timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return None


def _controller_toml(secrets: Secrets, db: Path, port: int, hook: str, heartbeat: float) -> str:
    return f"""
[controller]
listen = "127.0.0.1:{port}"
database_url = "sqlite:///{db}"
cluster_secret_file = "{secrets.dir / "cluster.secret"}"
admin_token_file = "{secrets.dir / "admin.token"}"
read_token_file = "{secrets.dir / "read.token"}"
loop_interval_s = 0.2
heartbeat_timeout_s = {heartbeat}

[alerts]
webhook_url = "{hook}"
"""


@pytest.fixture
def controller(
    secrets: Secrets, tmp_path: Path, receiver: Receiver
) -> Iterator[tuple[subprocess.Popen[bytes], Path, str]]:
    port = free_port()
    cfg = tmp_path / "controller.toml"
    toml = _controller_toml(secrets, tmp_path / "c.db", port, receiver.url + "/hook", 300)
    cfg.write_text(toml)
    proc = _spawn("controller", cfg, tmp_path / "controller.log")
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, (tmp_path / "controller.log").read_text()[-3000:]
        try:
            return httpx.get(url + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, 90, "controller ready")
    try:
        yield proc, cfg, url
    finally:
        _stop(proc)


def test_controller_sighup_applies_a_threshold_and_refuses_an_invalid_file(
    controller: tuple[subprocess.Popen[bytes], Path, str],
    secrets: Secrets,
    receiver: Receiver,
    tmp_path: Path,
):
    proc, cfg, url = controller
    admin = {"Authorization": f"Bearer {secrets.admin}"}
    report = {
        "node": "node1",
        "report_id": str(uuid.uuid4()),
        "sent_at": datetime.now(UTC).isoformat(),
        "findings": [],
        "metrics": {},
    }
    r = httpx.post(url + "/api/v1/reports", json=report, headers=secrets.headers("node1"))
    assert r.status_code == 202, r.text

    def verdict() -> str:
        return str(
            httpx.get(url + "/api/v1/nodes/node1", headers=admin, timeout=5).json()["verdict"]
        )

    # heard from just now, with a heartbeat timeout of 300 s
    assert verdict() == "healthy"
    # the threshold lowered to 0.5 s: the same process now calls the silent node unknown
    cfg.write_text(
        cfg.read_text().replace("heartbeat_timeout_s = 300", "heartbeat_timeout_s = 0.5")
    )
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: verdict() == "unknown", 60, "node1 unknown under the reloaded threshold")
    metrics = url + "/metrics"
    wait_for(lambda: _metric(metrics, 'babysitter_config_reload_total{result="ok"}') == 1, 30, "ok")
    wait_for(lambda: _metric(metrics, "babysitter_config_last_reload_success") == 1, 30, "gauge")
    wait_for(
        lambda: _metric(metrics, 'babysitter_config_reload_total{result="invalid"}') == 0,
        30,
        "no refused reload counted",  # None while absent or rate-limited (429): asked again
    )

    # an invalid file: the old configuration stays, and the log, the metric and an alert say so
    good = cfg.read_text()
    cfg.write_text(good.replace("loop_interval_s = 0.2", "loop_interval_s = -1"))
    proc.send_signal(signal.SIGHUP)
    wait_for(
        lambda: _metric(metrics, 'babysitter_config_reload_total{result="invalid"}') == 1,
        30,
        "the refused reload counted",
    )
    wait_for(lambda: _metric(metrics, "babysitter_config_last_reload_success") == 0, 30, "gauge 0")
    log = (tmp_path / "controller.log").read_text()
    assert "configuration reload refused" in log and "loop_interval_s" in log

    def alert(state: str) -> bool:
        return any(
            b.get("condition") == "config_reload_failed" and b.get("state") == state
            for b in receiver.bodies("/hook")
        )

    wait_for(lambda: alert("firing"), 60, "config_reload_failed alert")
    assert verdict() == "unknown"  # still the reloaded threshold, not a default
    assert proc.poll() is None  # never restarted

    # fixed: the alert resolves, the metric says the file is good again
    cfg.write_text(good)
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: alert("resolved"), 60, "config_reload_failed resolved")
    wait_for(lambda: _metric(metrics, "babysitter_config_last_reload_success") == 1, 30, "gauge 1")


def _agent_toml(
    secrets: Secrets, tmp_path: Path, url: str, metrics_port: int, min_gb: float
) -> str:
    return f"""
[agent]
node_name = "node1"
controller_url = "{url}"
token_file = "{secrets.node_token_file("node1")}"
spool_path = "{tmp_path / "spool.db"}"
interval_s = 0.3
request_timeout_s = 2
enabled_checks = ["host.resources"]
metrics_listen = "127.0.0.1:{metrics_port}"

[checks.host]
check_slurmd = false
min_free_gb = {min_gb}
paths = ["{tmp_path}"]
interval_s = 0.2
"""


def test_agent_sighup_applies_a_threshold_and_keeps_its_config_on_an_invalid_file(
    controller: tuple[subprocess.Popen[bytes], Path, str], secrets: Secrets, tmp_path: Path
):
    _, _, url = controller
    admin = {"Authorization": f"Bearer {secrets.admin}"}
    mport = free_port()
    cfg = tmp_path / "agent.toml"
    cfg.write_text(_agent_toml(secrets, tmp_path, url, mport, 0))
    agent = _spawn("agent", cfg, tmp_path / "agent.log")
    metrics = f"http://127.0.0.1:{mport}/metrics"

    def codes() -> set[str]:
        r = httpx.get(url + "/api/v1/nodes/node1", headers=admin, timeout=5)
        if r.status_code == 404:
            return {"(not yet)"}
        return {f["code"] for f in r.json()["open_findings"]}

    try:
        wait_for(lambda: "(not yet)" not in codes(), 90, "node1 reporting")
        assert "disk.low" not in codes()
        # no disk has this much free space: the reloaded threshold makes it a warning
        cfg.write_text(_agent_toml(secrets, tmp_path, url, mport, 1e9))
        agent.send_signal(signal.SIGHUP)
        wait_for(lambda: "disk.low" in codes(), 60, "disk.low under the reloaded threshold")
        wait_for(
            lambda: _metric(metrics, 'babysitter_config_reload_total{result="ok"}') == 1, 30, "ok"
        )

        # an invalid file (a misspelled key): the threshold stays, and the agent says why
        cfg.write_text(
            _agent_toml(secrets, tmp_path, url, mport, 0).replace("min_free_gb", "min_free_gib")
        )
        agent.send_signal(signal.SIGHUP)
        wait_for(lambda: "config.reload_failed" in codes(), 60, "the reload finding")
        assert "disk.low" in codes()  # the old (reloaded) threshold still acts
        wait_for(
            lambda: _metric(metrics, "babysitter_config_last_reload_success") == 0, 30, "gauge 0"
        )
        assert _metric(metrics, 'babysitter_config_reload_total{result="invalid"}') == 1
        log = (tmp_path / "agent.log").read_text()
        assert "configuration reload refused" in log and "min_free_gib" in log
        node = httpx.get(url + "/api/v1/nodes/node1", headers=admin, timeout=5).json()
        assert node["verdict"] == "suspect"  # the controller alerts on it; no drain
        assert agent.poll() is None
    finally:
        _stop(agent)
