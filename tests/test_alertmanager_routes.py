"""Who gets which alert: the shipped Alertmanager example (deploy/alertmanager/alertmanager.yml)
routes the labels babysitter really posts, so a job's alert (a line the job printed into its
own log) reaches the job receiver and never on-call's pager, whatever its severity, while a
node's critical alert still pages (amtool decides, as Alertmanager would). babysitter's own
sinks route alike: no job alert reaches PagerDuty or on-call's Slack."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from babysitter.config import parse_config
from babysitter.controller.loop.decide.node.job_alerts import JOB_ALERT_PREFIX
from babysitter.controller.loop.record.alerts import Alert, AlertRouter
from babysitter.controller.loop.record.alerts.router import sinks_from_config
from babysitter.controller.loop.record.alerts.sinks import AlertmanagerSink
from babysitter.finding import Severity
from tests.fixtures.controller import which
from tests.test_alerts import MemoryState, unhealthy

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
RULES = ROOT / "deploy" / "prometheus" / "babysitter-rules.yml"
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([which("amtool"), *args], capture_output=True, text=True, timeout=60)


def routed_to(labels: dict[str, str], config: Path = CONFIG) -> str:
    """The receiver Alertmanager picks for an alert with these labels."""
    pairs = [f"{k}={v}" for k, v in labels.items()]
    r = amtool("config", "routes", "test", f"--config.file={config}", *pairs)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


def posted(alert: Alert) -> dict[str, str]:
    """The labels babysitter posts to Alertmanager for this alert."""
    return AlertmanagerSink("http://alertmanager.invalid").payload(alert)[0]["labels"]


def job_alert(severity: Severity) -> Alert:
    return Alert(
        None,
        f"{JOB_ALERT_PREFIX}4242",
        severity,
        "job 4242 on n1, n2: nccl.logs: NCCL WARN NET/IB : Got completion with error 12",
        "nothing changed in Slurm",
        NOW,
        nodes=["n1", "n2"],
        owner="alice",
    )


def test_amtool_checks_the_shipped_config():
    r = amtool("check-config", str(CONFIG))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("severity", [Severity.WARNING, Severity.CRITICAL])
def test_a_job_log_alert_goes_to_the_job_receiver_never_the_pager(severity):
    labels = posted(job_alert(severity))
    assert (labels["route"], labels["job_id"], labels["owner"]) == ("job", "4242", "alice")
    assert routed_to(labels) == "job-owners"


def test_a_node_alert_still_pages_and_a_node_warning_goes_to_chat():
    assert routed_to(posted(unhealthy("n1"))) == "oncall-pager"
    lemon = Alert("n1", "lemon_node", Severity.WARNING, "drained 3 times", "nothing", NOW)
    assert posted(lemon)["route"] == "oncall"
    assert routed_to(posted(lemon)) == "oncall-chat"


def test_the_prometheus_rules_alerts_route_by_their_severity():
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    pager = {"critical": "oncall-pager", "warning": "oncall-chat", "info": "oncall-chat"}
    for rule in (r for r in rules if "alert" in r):
        labels = {"alertname": rule["alert"], **rule.get("labels", {})}
        assert routed_to(labels) == pager[labels["severity"]], rule["alert"]


def test_without_the_job_route_a_critical_job_alert_would_page(tmp_path):
    """The routing test bites: the same alert under a config without the job route pages."""
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["route"]["routes"] = [r for r in cfg["route"]["routes"] if r["receiver"] != "job-owners"]
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(yaml.safe_dump(cfg))
    assert routed_to(posted(job_alert(Severity.CRITICAL)), broken) == "oncall-pager"


def test_babysitters_own_sinks_keep_job_alerts_off_oncall(receiver):
    """A site that pages on warnings and chats on-call's Slack: a job's alert reaches neither,
    only the job channel and the labelled sinks (webhook, Alertmanager); a node's does."""
    url = receiver.url
    cfg = parse_config(
        {
            "alerts": {
                "pagerduty_routing_key": "k" * 32,
                "pagerduty_url": url + "/pd",
                "route_pagerduty": "warning",
                "slack_webhook_url": url + "/slack",
                "job_slack_webhook_url": url + "/jobs",
                "webhook_url": url + "/hook",
            }
        }
    )
    r = AlertRouter(sinks_from_config(cfg), MemoryState())
    r.process([job_alert(Severity.WARNING)], [], NOW)
    assert receiver.bodies("/pd") == [] and receiver.bodies("/slack") == []
    [hook] = receiver.bodies("/hook")
    assert (hook["route"], hook["job_id"], hook["owner"]) == ("job", "4242", "alice")
    assert "job 4242" in receiver.bodies("/jobs")[0]["text"]
    r.process([unhealthy("n1")], [], NOW)
    assert len(receiver.bodies("/pd")) == 1 and len(receiver.bodies("/slack")) == 1
    assert len(receiver.bodies("/jobs")) == 1  # on-call's alert is not the job channel's
