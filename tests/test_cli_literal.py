"""Text a node or a job owner controls (finding messages, checkpoint paths) is shown literally
by `babysitter findings`, `jobs` and `status`: rich reads `[...]` as markup, and a closing tag
with no opening one made these commands fail for on-call."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from babysitter.cli import read_cmd
from babysitter.cli.tree import cli
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db.actions import ActionKind
from babysitter.controller.runtime import Controller
from babysitter.finding import Finding, Severity
from babysitter.report import Report
from tests.fixtures.controller import Secrets, controller_config

# a log line and a checkpoint path as a job could write them
HOSTILE_MESSAGE = "NCCL: rank 3 [/bold] loss [red]NaN[/red] [link=file:///etc/shadow]x[/link]"
HOSTILE_PATH = "/home/a/ckpt[/]/step[bold]7"


@pytest.fixture
def cli_on_controller(
    secrets: Secrets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Controller]:
    ctl = Controller(controller_config(secrets, f"sqlite:///{tmp_path / 'c.db'}"))
    ctl.setup()
    app = ctl.app()
    auth = {"Authorization": f"Bearer {secrets.read}"}
    # the commands' HTTP client is the in-process app (TestClient is an httpx.Client)
    monkeypatch.setattr(read_cmd, "client", lambda state, url, token: TestClient(app, headers=auth))
    yield ctl
    ctl.close()


def run(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args), env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output + repr(r.exception)
    return r.output


def test_findings_jobs_and_status_show_untrusted_text_literally(cli_on_controller):
    ctl = cli_on_controller
    f = Finding(
        check="nccl.log",
        component="host",
        severity=Severity.CRITICAL,
        code="nccl.hang",
        message=HOSTILE_MESSAGE,
    )
    report = Report(
        node="node3",
        report_id=str(uuid.uuid4()),
        sent_at=datetime.now(UTC),
        findings=[f],
        metrics={},
    )
    ReportWriter(ctl.store).write([report])
    ctl.store.upsert_job(42, nodes=["node3"], state="RUNNING", resume_point=HOSTILE_PATH)

    assert HOSTILE_MESSAGE in run("findings", "node3")
    assert HOSTILE_PATH in run("jobs")
    assert HOSTILE_MESSAGE in run("status")


def test_status_shows_a_requeue_held_for_the_link_grace(cli_on_controller):
    """On-call sees which babysat job waits on a link fault, and until when."""
    ctl = cli_on_controller
    ctl.store.record_action(
        ActionKind.REQUEUE,
        node="node3",
        job_id=42,
        reason="ib.ports: ib:mlx5_0/1 is DOWN (physical Disabled)",
        rule="job_link_grace",
        outcome="held until 2026-11-26T08:00:30+00:00: a link fault NCCL may ride out",
    )
    out = run("status")
    assert "1 pending actions" in out
    assert "job 42 on node3: requeue held for the link grace (held until 2026-11-26T08:00:30" in out
