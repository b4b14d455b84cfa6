"""Read once per tick: a read the tick makes again (the alert router, the RMA step and the
admission step each asked for the firing alerts; three steps for the open remediations) is
answered from the tick's first read of it, until something writes the table it came from.

Only the thread running the tick is answered from memory, and only inside `store.tick_reads()`:
the API's and the ingest's reads always go to the database. A write is seen by the engine's
cursor events, whoever makes it (a step, the ingest thread, an API handler): it makes every read
of its table stale at once, before and after the statement runs, so a step never reads around
its own or anyone's write. A write whose table cannot be told makes every read stale."""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, event

T = TypeVar("T")
R = TypeVar("R")

_WRITE = re.compile(r'^\s*(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)"?', re.I)
_COLUMN = re.compile(r'\s*"?(\w+)"?\s*=')
_WHERE = re.compile(r"\sWHERE\b", re.I)
_READ = re.compile(r"^\s*(?:SELECT|PRAGMA|SAVEPOINT|RELEASE|ROLLBACK|BEGIN|COMMIT)\b", re.I)


# Every Store of this process on one database shares its write generations (a second Store
# on the same SQLite file, as the CLI's or a test's, writes where the first one reads).
_SHARED: dict[str, Generations] = {}
_SHARED_LOCK = threading.Lock()
MAX_AGE_S = 30.0  # a read remembered across ticks is read again at least this often
_ABSENT = object()  # read_many: a key the read found nothing for


def _elapsed() -> float:
    """Real seconds, never the loop's clock (which a simulation may run faster): the age limit
    guards against writers outside this process, and they act in real time."""
    return time.perf_counter()


class Generations:
    """Write generations of one database's tables and columns, bumped by every write a Store
    of this process makes there."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_name: dict[str, int] = {}
        self.everything = 0  # writes whose table could not be told

    def seen(self, _c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if _READ.match(statement):
            return
        bumped = _written(statement)
        with self.lock:
            if bumped is None:
                self.everything += 1
            for name in bumped or ():
                self.by_name[name] = self.by_name.get(name, 0) + 1

    def versions(self, reads: tuple[str, ...]) -> tuple[int, ...]:
        """What remembered reads depend on: every write of their table (`t`), or of their
        column (`t.c`: an update of it, or any insert or delete in `t`)."""
        g = self.by_name
        with self.lock:
            out = [self.everything]
            for name in reads:
                out.append(g.get(name, 0))
                if "." in name:
                    out.append(g.get(name.split(".", 1)[0] + "#rows", 0))
            return tuple(out)


def _generations(engine: Engine) -> Generations:
    with _SHARED_LOCK:
        g = _SHARED.setdefault(engine.url.render_as_string(hide_password=True), Generations())
    event.listen(engine, "before_cursor_execute", g.seen)
    event.listen(engine, "after_cursor_execute", g.seen)
    return g


class TickReads:
    """The tick's reads, each remembered under what it read (a table, or one column of a table:
    `nodes.drain_episode`) and the write generations of those when it was read.

    With SQLite the controller's process is the only writer (one controller: docs/deploy.md;
    the CLI goes through its API), so its writes are all seen here and a read stays good from
    one tick to the next until its tables are written: a steady tick reads only what changed.
    As a safety net against a writer outside the process, nothing is remembered longer than
    MAX_AGE_S. With Postgres other controllers write too (their API and ingest): memory lasts
    one tick."""

    def __init__(self, engine: Engine) -> None:
        self._g = _generations(engine)
        self._memo: dict[tuple[Any, ...], tuple[tuple[int, ...], Any]] = {}
        self._used: set[tuple[Any, ...]] = set()  # keys read this tick (the rest is dropped)
        self._owner: int | None = None
        self._engine = engine
        self._conn: Connection | None = None  # the tick's one connection for its reads
        self.across_ticks = engine.dialect.name == "sqlite"
        self._since = _elapsed()  # when the memory was last emptied
        self.hits = 0  # reads answered from memory (tests, the tick's metrics)

    def _versions(self, reads: tuple[str, ...]) -> tuple[int, ...]:
        return self._g.versions(reads)

    def forget(self) -> None:
        """Drop everything remembered: the database was changed where no statement of this
        process shows it (a restore from a backup)."""
        self._memo, self._since = {}, _elapsed()

    @property
    def active(self) -> bool:
        """This thread runs a tick (its reads are remembered)."""
        return self._owner == threading.get_ident()

    @contextmanager
    def tick(self) -> Iterator[None]:
        """The tick's span: this thread's reads are remembered (until it ends, or with SQLite
        until their tables are written)."""
        self._owner, self._used = threading.get_ident(), set()
        if not self.across_ticks or _elapsed() - self._since > MAX_AGE_S:
            self._memo, self._since = {}, _elapsed()
        try:
            yield
        finally:
            # what the tick did not ask for is not kept (keys with arguments would pile up)
            self._memo = {k: v for k, v in self._memo.items() if k in self._used}
            if not self.across_ticks:
                self._memo = {}
            self._owner = None
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection to read with: inside the tick, on its thread, the tick's one (a
        connection per read was a pool checkout and a rollback each); a read that fails
        rolls it back so the next step's read starts clean. Elsewhere a fresh one."""
        if not self.active:
            with self._engine.connect() as c:
                yield c
            return
        if self._conn is None:
            self._conn = self._engine.connect()
        try:
            yield self._conn
        except BaseException:
            self._conn.rollback()
            raise
        else:
            # each read sees every write committed before it (and holds no snapshot)
            self._conn.commit()

    def read(self, tables: tuple[str, ...], key: tuple[Any, ...], fn: Callable[[], T]) -> T:
        """fn's answer; inside the tick, the one remembered under `key` while none of `tables`
        (a table, or `table.column`) was written since."""
        if not self.active:
            return fn()
        stamp = self._versions(tables)
        self._used.add(key)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == stamp:
            self.hits += 1
            return hit[1]
        value = fn()
        self._memo[key] = (stamp, value)
        return value

    def mark(self, tables: tuple[str, ...]) -> tuple[int, ...] | None:
        """Taken before a read whose rows are then `seed`ed (None outside the tick): a write
        between the read and the seeding makes them stale, not remembered as new."""
        return self._versions(tables) if self.active else None

    def seed(self, stamp: tuple[int, ...] | None, items: dict[Any, Any]) -> None:
        """Remember per-key values a wider read has just read (the policy's node rows hold
        each node's open findings), under the versions `stamp` took before that read."""
        if stamp is None or not self.active:
            return
        for key, value in items.items():
            self._memo[key] = (stamp, value)

    def read_many(
        self,
        tables: tuple[str, ...],
        keys: list[Any],
        fn: Callable[[list[Any]], dict[Any, T]],
    ) -> dict[Any, T]:
        """fn's answers for `keys`, one key each (a key fn leaves out has no answer); inside
        the tick, only the keys not remembered since a write to `tables` are read, in one
        call."""
        if not self.active:
            return fn(keys)
        stamp = self._versions(tables)
        self._used.update(keys)
        out: dict[Any, T] = {}
        missing = []
        for key in keys:
            hit = self._memo.get(key)
            if hit is not None and hit[0] == stamp:
                self.hits += 1
                if hit[1] is not _ABSENT:
                    out[key] = hit[1]
            else:
                missing.append(key)
        if missing:
            got = fn(missing)
            for key in missing:
                self._memo[key] = (stamp, got.get(key, _ABSENT))
            out.update(got)
        return out

    def read_since(
        self,
        tables: tuple[str, ...],
        key: tuple[Any, ...],
        since: datetime,
        fn: Callable[[datetime], list[R]],
        when: Callable[[R], datetime],
    ) -> list[R]:
        """The rows fn(since) returns (each timed by `when`). A window that only moved forward
        over unwritten tables is answered from the rows read for an earlier start: the rows
        that left the window are dropped, and none can have entered it without a write."""
        if not self.active:
            return fn(since)
        stamp = self._versions(tables)
        self._used.add(key)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == stamp and hit[1][0] <= since:
            self.hits += 1
            return [r for r in hit[1][1] if when(r) >= since]
        rows = fn(since)
        self._memo[key] = (stamp, (since, rows))
        return list(rows)


# The store's statements are built once and their text repeats: each is parsed once (the
# parse was 4 % of a soak's CPU, every write being seen twice).
@functools.lru_cache(maxsize=1024)
def _written(statement: str) -> tuple[str, ...] | None:
    """What a write statement changes: its table, and for an update each column it sets; for
    an insert or a delete, its rows (every column). None: not told (every remembered read is
    stale)."""
    m = _WRITE.match(statement)
    if m is None:
        return None
    table = m.group(1).lower()
    if statement.lstrip()[:6].upper() != "UPDATE":
        return (table, table + "#rows")
    columns = _set_columns(statement)
    if columns is None:
        return (table, table + "#rows")
    return (table, *(f"{table}.{c}" for c in columns))


def _set_columns(statement: str) -> list[str] | None:
    """The columns an UPDATE's SET clause assigns, read at the top level only (a value may be
    a subquery with commas, parentheses and its own WHERE). None when it cannot be told."""
    start = re.search(r"\bSET\b", statement, re.I)
    if start is None:
        return None
    depth = 0
    part: list[str] = []
    parts: list[str] = []
    rest = statement[start.end() :]
    i = 0
    while i < len(rest):
        ch = rest[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0 and ch == ",":
            parts.append("".join(part))
            part = []
            i += 1
            continue
        elif depth == 0 and _WHERE.match(rest, i):
            break
        part.append(ch)
        i += 1
    parts.append("".join(part))
    columns = []
    for p in parts:
        c = _COLUMN.match(p)
        if c is None:
            return None
        columns.append(c.group(1).lower())
    return columns
