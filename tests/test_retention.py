"""Retention (controller/db/retention.py) against SQLite and a real Postgres: clean reports are
thinned after clean_report_minutes, reports with findings stay for retention_days, deletes go
in small batches from a thread of their own."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from babysitter.config import ControllerConfig
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db import models as m
from babysitter.controller.db.retention import Retention
from babysitter.controller.db.store import Store
from babysitter.finding import Finding, Severity
from babysitter.report import Report

WARN = Finding(check="gpu.pcie", component="gpu2", severity=Severity.WARNING, code="x", message="m")


def _age(store: Store, ids: list[str], age: timedelta) -> None:
    with store.engine.begin() as c:
        c.execute(
            update(m.reports)
            .where(m.reports.c.report_id.in_(ids))
            .values(received_at=datetime.now(UTC) - age)
        )


def test_retention_thins_clean_reports_keeps_findings(db_url):
    store = Store(db_url)
    try:
        store.upgrade()
        ids = {k: [str(uuid.uuid4()) for _ in range(5)] for k in ("clean_old", "clean_new", "warn")}
        ids["warn_ancient"] = [str(uuid.uuid4())]
        for kind, rids in ids.items():
            ReportWriter(store).write(
                [
                    Report(
                        node="n1",
                        report_id=r,
                        sent_at=datetime.now(UTC),
                        findings=[WARN] if "warn" in kind else [],
                        metrics={},
                    )
                    for r in rids
                ]
            )
        _age(store, ids["clean_old"] + ids["warn"], timedelta(minutes=30))
        _age(store, ids["warn_ancient"], timedelta(days=40))
        cfg = ControllerConfig(retention_days=30, clean_report_minutes=10, retention_batch=2)
        ret = Retention(store, cfg)
        assert ret.run_once() == 6
        assert ret.batches >= 4  # 5 clean ones 2 at a time, plus the ancient one
        assert sorted(store.report_ids()) == sorted(ids["clean_new"] + ids["warn"])
        assert store.count("findings") == 5
        assert ret.run_once() == 0
    finally:
        store.close()


def test_retention_runs_in_its_own_thread(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        store.upgrade()
        rid = str(uuid.uuid4())
        ReportWriter(store).write(
            [Report(node="n1", report_id=rid, sent_at=datetime.now(UTC), findings=[], metrics={})]
        )
        _age(store, [rid], timedelta(hours=1))
        ret = Retention(store, ControllerConfig(retention_interval_s=0.05))
        ret.start()
        try:
            deadline = time.monotonic() + 30
            while store.report_ids() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            ret.stop()
        assert store.report_ids() == []
        assert ret._thread is not None and ret._thread.name == "retention"
    finally:
        store.close()
