"""One statement for "insert this row, or update it where it is": the database's own
INSERT ... ON CONFLICT DO UPDATE (SQLite >= 3.24 and PostgreSQL), instead of a read to
learn which of the two to write (a statement less each time an alert, a kv value or a job
is saved, and no window between the read and the write)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, String, Table, bindparam, update
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


def upsert_many(
    c: Connection,
    table: Table,
    key: str,
    rows: list[tuple[Any, dict[str, Any]]],
    only_on_insert: Callable[[frozenset[str]], dict[str, Any]] | None = None,
) -> None:
    """upsert() of each (key value, values) in turn, in one statement for each run of rows
    that set the same columns (an alert storm's records: one, not one per node). A key met
    twice in a run keeps its last values, as the writes one by one would have.
    `only_on_insert(columns)`: what a new row of a run setting `columns` also gets."""
    runs: list[tuple[frozenset[str], dict[Any, dict[str, Any]]]] = []
    for k, values in rows:
        if not runs or runs[-1][0] != frozenset(values):
            runs.append((frozenset(values), {}))
        runs[-1][1][k] = values
    for columns, run in runs:
        first = only_on_insert(columns) if only_on_insert is not None else {}
        if _missing(table, {key: None, **first, **next(iter(run.values()))}):
            # a partial row (a resolve) updates the row there is, as upsert() does
            done = c.execute(
                update(table).where(table.c[key] == bindparam("b_key")),
                [{"b_key": k, **v} for k, v in run.items()],
            ).rowcount
            if done != len(run):  # some row is not there: each as upsert() would (an error)
                for k, v in run.items():
                    upsert(c, table, {key: k}, v, first)
            continue
        stmt = dialect_insert(c.dialect.name)(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=[key], set_={col: stmt.excluded[col] for col in sorted(columns)}
        )
        c.execute(stmt, [{**first, key: k, **v} for k, v in run.items()])


def clamped(table: Any, values: dict[str, Any]) -> dict[str, Any]:
    """Strings cut to their column's width (Postgres refuses longer ones; SQLite would keep
    them): job names, users and states come from users and Slurm."""
    out = dict(values)
    for k, v in values.items():
        col = table.c.get(k)
        width = col.type.length if col is not None and isinstance(col.type, String) else None
        if isinstance(v, str) and width is not None and len(v) > width:
            out[k] = v[:width]
    return out
