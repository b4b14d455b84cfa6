"""Statements SQLAlchemy never caches, compiled once instead of on every execution.

A dialect's INSERT ... ON CONFLICT (sqlite.insert, postgresql.insert) declares
`inherit_cache = False`: SQLAlchemy compiles it anew for every execution. The report ingest
runs one for every batch (the dedup of retried reports); compiling it was a sixth of a batch.
A statement built once with its parameters as bind parameters compiles to the same SQL each
time, so it is compiled once per database dialect and shape of its parameters (the columns
given, one row or many: what SQLAlchemy's own cache keys a compilation on besides the
statement) and the compiled form is executed."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, CursorResult
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import Compiled
from sqlalchemy.sql.expression import ClauseElement


class Precompiled:
    """One statement, compiled once per (dialect, parameter shape)."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._compiled: dict[tuple[Dialect, tuple[str, ...], bool], Compiled] = {}
        self._lock = threading.Lock()

    def execute(self, conn: Connection, params: Sequence[Mapping[str, Any]]) -> CursorResult[Any]:
        """Run it with `params` (one row or an executemany), as conn.execute would."""
        many = len(params) > 1
        key = (conn.dialect, tuple(sorted(params[0])) if params else (), many)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self.statement.compile(
                dialect=conn.dialect, column_keys=list(key[1]), for_executemany=many
            )
            with self._lock:
                self._compiled[key] = compiled
        return conn.execute(compiled, params)  # type: ignore[call-overload]
