"""Schema artefacts stay in sync with the models: sql/schema.sql and the Alembic migrations."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from babysitter.controller.db.models import metadata
from babysitter.controller.db.schema_sql import PATH, render
from babysitter.controller.db.store import Store


def test_schema_sql_matches_models():
    assert PATH.read_text() == render(), (
        "sql/schema.sql is stale: run python -m babysitter.controller.db.schema_sql --write"
    )


def test_migrations_produce_the_models_schema(db_url):
    store = Store(db_url)
    try:
        store.upgrade()
        with store.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        assert diff == [], f"models and migrations differ: {diff}"
        store.upgrade()  # idempotent
    finally:
        store.close()


def test_retention_prunes_old_reports(db_url):
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from babysitter.controller.api.ingest import ReportWriter
    from babysitter.controller.db import models as m
    from babysitter.finding import Finding, Severity
    from babysitter.report import Report

    store = Store(db_url)
    try:
        store.upgrade()
        f = Finding(
            check="gpu.memory", component="gpu0", severity=Severity.WARNING, code="x", message="m"
        )
        ReportWriter(store).write(
            [
                Report(
                    node="n1",
                    report_id="00000000-0000-4000-8000-000000000001",
                    sent_at=datetime.now(UTC),
                    findings=[f],
                    metrics={},
                ),
                Report(
                    node="n1",
                    report_id="00000000-0000-4000-8000-000000000002",
                    sent_at=datetime.now(UTC),
                    findings=[f],
                    metrics={},
                ),
            ]
        )
        with store.engine.begin() as c:
            c.execute(
                update(m.reports)
                .where(m.reports.c.report_id == "00000000-0000-4000-8000-000000000001")
                .values(received_at=datetime.now(UTC) - timedelta(days=40))
            )
        assert store.prune(30) == 1
        assert store.report_ids() == ["00000000-0000-4000-8000-000000000002"]
        assert store.count("findings") == 1
    finally:
        store.close()
