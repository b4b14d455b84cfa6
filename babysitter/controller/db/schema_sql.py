"""Render sql/schema.sql (PostgreSQL DDL) from the models, for DBAs. Kept in sync by
a test; regenerate with `python -m babysitter.controller.db.schema_sql --write`."""

from __future__ import annotations

import sys
from importlib.resources import files
from pathlib import Path

from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from babysitter.controller.db.models import metadata

PATH = Path(str(files("babysitter.sql") / "schema.sql"))


def render() -> str:
    dialect = postgresql.dialect()
    out = [
        "-- babysitter database schema (PostgreSQL), generated from",
        "-- babysitter/controller/db/models.py; migrations live in sql/versions/.",
        "",
    ]
    for table in metadata.sorted_tables:
        out.append(str(CreateTable(table).compile(dialect=dialect)).strip() + ";")
        for idx in sorted(table.indexes, key=lambda i: str(i.name)):
            out.append(str(CreateIndex(idx).compile(dialect=dialect)).strip() + ";")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    if "--write" in sys.argv:
        PATH.write_text(render())
    else:
        sys.stdout.write(render())
