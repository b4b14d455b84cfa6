"""One statement for "insert this row, or update it where it is": the database's own
INSERT ... ON CONFLICT DO UPDATE (SQLite >= 3.24 and PostgreSQL), instead of a read to
learn which of the two to write (a statement less each time an alert, a kv value or a job
is saved, and no window between the read and the write)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Table, update
from sqlalchemy.dialects import postgresql, sqlite


def dialect_insert(dialect_name: str) -> Any:
    """The INSERT that knows ON CONFLICT for this database (SQLite's, or PostgreSQL's)."""
    return postgresql.insert if dialect_name == "postgresql" else sqlite.insert


def upsert(
    c: Connection,
    table: Table,
    key: dict[str, Any],
    values: dict[str, Any],
    only_on_insert: dict[str, Any] | None = None,
) -> None:
    """The row of `table` whose primary key is `key` holds `values` afterwards; a new row also
    gets `only_on_insert` (its first-seen time, defaults). Values that could not make a whole
    row (a resolve sets only the state) update the row there is: the database checks an
    insert's NOT NULL columns before it sees the conflict."""
    row = {**key, **(only_on_insert or {}), **values}
    if _missing(table, row):
        where = [table.c[k] == v for k, v in key.items()]
        if c.execute(update(table).where(*where).values(**values)).rowcount == 0:
            c.execute(table.insert().values(**row))  # fails on the missing columns, as before
        return
    stmt = dialect_insert(c.dialect.name)(table).values(**row)
    c.execute(stmt.on_conflict_do_update(index_elements=list(key), set_=values))


def _missing(table: Table, row: dict[str, Any]) -> bool:
    """Whether `row` leaves out a column an insert needs (NOT NULL, no default)."""
    return any(
        not col.nullable
        and col.default is None
        and col.server_default is None
        and col.autoincrement is not True
        and col.name not in row
        for col in table.columns
    )
