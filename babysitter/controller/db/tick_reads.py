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
from typing import Any, TypeVar, cast

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
        self._own = threading.local()  # a write-through's own bumps (TickReads.writing)

    def seen(self, _c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if _READ.match(statement):
            return
        bumped = _written(statement)
        own: dict[str, int] | None = getattr(self._own, "counts", None)
        with self.lock:
            if bumped is None:
                self.everything += 1
            for name in bumped or ():
                self.by_name[name] = self.by_name.get(name, 0) + 1
                if own is not None:
                    own[name] = own.get(name, 0) + 1

    def own_counts(self, counts: dict[str, int] | None) -> None:
        """Count this thread's bumps in `counts` from now on (None: stop)."""
        self._own.counts = counts

    def versions(self, reads: tuple[str, ...]) -> tuple[int, ...]:
        """What remembered reads depend on: every write of their table (`t`), or of their
        column (`t.c`: an update of it, or any insert or delete in `t`)."""
        with self.lock:
            return _as_versions(self.by_name, reads, self.everything)


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
        # how a remembered read of one table takes the tick's own writes of it (`writing`)
        self._patch: dict[tuple[Any, ...], tuple[str, tuple[str, ...], Patch]] = {}
        # rows the tick's own writes wrote, by table and id, under the table's generations
        self._fresh: dict[str, tuple[tuple[int, ...], dict[Any, Any]]] = {}
        self._index: dict[tuple[Any, ...], tuple[list[Any], dict[Any, Any]]] = {}
        self._deferred: dict[str, tuple[Callable[[list[Any]], None], list[Any]]] = {}
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
            self._patch = {k: v for k, v in self._patch.items() if k in self._memo}
            self._fresh, self._index = {}, {}
            self._owner = None
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()
            deferred, self._deferred = self._deferred, {}
            for flush, items in deferred.values():
                flush(items)  # a failure fails the tick (its caller counts and logs it)

    def deferred(self, name: str, flush: Callable[[list[Any]], None]) -> list[Any] | None:
        """Inside the tick, on its thread: the list of `name`'s writes held to its end, where
        `flush` writes them together (the audit log's entries: one statement a tick, not one
        per step). None elsewhere: write now."""
        if not self.active:
            return None
        if name not in self._deferred:
            self._deferred[name] = (flush, [])
        return self._deferred[name][1]

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

    def read(
        self,
        tables: tuple[str, ...],
        key: tuple[Any, ...],
        fn: Callable[[], T],
        patch: Callable[[T, list[Any]], T | None] | None = None,
    ) -> T:
        """fn's answer; inside the tick, the one remembered under `key` while none of `tables`
        (a table, or `table.column`) was written since. `patch`: the answer after the tick's
        own write of these rows of the first of `tables` (`writing`); None when it cannot
        tell (the read is made again)."""
        if not self.active:
            return fn()
        if patch is not None:
            self._patch[key] = (tables[0], tables, patch)
        stamp = self._versions(tables)
        self._used.add(key)
        hit = self._current(key, stamp)
        if hit is not None:
            self.hits += 1
            return cast(T, hit[0])
        value = fn()
        self._memo[key] = (stamp, value)
        return value

    def _current(self, key: tuple[Any, ...], stamp: tuple[int, ...]) -> tuple[Any] | None:
        """The answer remembered under `key` if still good at `stamp` (in a 1-tuple), with
        the tick's own writes since applied; None: read it again."""
        hit = self._memo.get(key)
        if hit is None or hit[0] != stamp:
            return None
        value = hit[1]
        if isinstance(value, _Patched):
            value = self._patch[key][2](value.base, list({r.id: r for r in value.rows}.values()))
            if value is None:
                del self._memo[key]
                return None
            self._memo[key] = (stamp, value)
        return (value,)

    def remembered(self, tables: tuple[str, ...], key: tuple[Any, ...]) -> Any:
        """The answer remembered under `key` (as `read` stored it) if it is still good, with
        the tick's own writes applied; None when it is not (nothing is read here)."""
        if not self.active:
            return None
        hit = self._current(key, self._versions(tables))
        if hit is None:
            return None
        self._used.add(key)
        self.hits += 1
        return hit[0]

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
        patch: Callable[[list[R], list[Any]], list[R] | None] | None = None,
    ) -> list[R]:
        """The rows fn(since) returns (each timed by `when`). A window that only moved forward
        over unwritten tables is answered from the rows read for an earlier start: the rows
        that left the window are dropped, and none can have entered it without a write.
        `patch`: as `read`'s (rows before the window are dropped when it is next asked)."""
        if not self.active:
            return fn(since)
        if patch is not None:
            self._patch[key] = (tables[0], tables, functools.partial(_patch_window, patch))
        stamp = self._versions(tables)
        self._used.add(key)
        hit = self._current(key, stamp)
        if hit is not None and hit[0][0] <= since:
            self.hits += 1
            return [r for r in hit[0][1] if when(r) >= since]
        rows = fn(since)
        self._memo[key] = (stamp, (since, rows))
        return list(rows)

    def known(self, table: str, ident: Any) -> Any:
        """The row of `table` with this id as it is now, if the tick knows it: one its own
        writes wrote (`writing`), or one of its current listings (remembered under
        `(table, ...)`); None when it does not, and on any thread but the tick's."""
        if not self.active:
            return None
        fresh = self._fresh.get(table)
        if fresh is not None and fresh[0] == self._versions((table,)) and ident in fresh[1]:
            return fresh[1][ident]
        for key, (_, reads, _) in self._patch.items():
            hit = self._memo.get(key)
            if key[0] != table or hit is None or hit[0] != self._versions(reads):
                continue
            value = hit[1]
            # a row the tick wrote since this listing was read is in `fresh`: the rest of it
            # is as read
            base = value.base if isinstance(value, _Patched) else value
            index = self._index.get(key)
            if index is None or index[0] is not base:
                index = self._index[key] = (base, {r.id: r for r in base})
            if ident in index[1]:
                return index[1][ident]
        return None

    @contextmanager
    def writing(self, table: str) -> Iterator[Written]:
        """The tick's own write of `table`, told its rows as written: the remembered reads of
        it that can take them (a `patch`) are brought up to date instead of read again. Only
        when nobody else wrote what they read meanwhile (its generations moved by this
        thread's statements alone, and only in `table`) and the write succeeded; otherwise
        they are stale as after any write. Outside the tick, or nested: a plain write."""
        if not self.active or getattr(self._g._own, "counts", None) is not None:
            yield Written()
            return
        counts: dict[str, int] = {}
        tables = {reads for _, reads, _ in self._patch.values()} | {(table,)}
        before = {reads: self._versions(reads) for reads in tables}
        written = Written()
        self._g.own_counts(counts)
        try:
            yield written
        finally:
            self._g.own_counts(None)
        if written.unknown:
            return
        self._wrote(table, before[(table,)], counts, written.rows)
        for key, (tab, reads, _) in list(self._patch.items()):
            hit = self._memo.get(key)
            if tab != table or hit is None or hit[0] != before.get(reads):
                continue
            after = self._versions(reads)
            if not _only_own(before[reads], after, counts, table, reads):
                continue
            # applied when next read: a rack's hundred writes cost one pass, not one each
            value = hit[1]
            if isinstance(value, _Patched):
                value.rows.extend(written.rows)
            else:
                value = _Patched(value, list(written.rows))
            self._memo[key] = (after, value)

    def _wrote(
        self, table: str, before: tuple[int, ...], counts: dict[str, int], rows: list[Any]
    ) -> None:
        """Keep the rows the tick has just written (by id) while nobody else writes `table`."""
        after = self._versions((table,))
        if not _only_own(before, after, counts, table, (table,)):
            return
        prev = self._fresh.get(table)
        kept = prev[1] if prev is not None and prev[0] == before else {}
        kept.update((r.id, r) for r in rows)
        self._fresh[table] = (after, kept)


def _as_versions(
    counts: dict[str, int], reads: tuple[str, ...], everything: int = 0
) -> tuple[int, ...]:
    """The generations (or a write's own counts) of `reads`, laid out as remembered reads are
    stamped: the untold writes first, then each name's, and a column's table's rows."""
    out = [everything]
    for name in reads:
        out.append(counts.get(name, 0))
        if "." in name:
            out.append(counts.get(name.split(".", 1)[0] + "#rows", 0))
    return tuple(out)


def _only_own(
    before: tuple[int, ...],
    after: tuple[int, ...],
    counts: dict[str, int],
    table: str,
    reads: tuple[str, ...],
) -> bool:
    """Every generation of `reads` moved by this thread's statements alone (`counts`), and
    none but `table`'s."""
    own = _as_versions(counts, reads)
    if any(a - b != o for a, b, o in zip(after, before, own, strict=True)):
        return False
    return not any(_as_versions(counts, tuple(r for r in reads if r != table))[1:])


Patch = Callable[[Any, list[Any]], Any]


class _Patched:
    """A remembered answer and the rows the tick has written since, not applied yet."""

    def __init__(self, base: Any, rows: list[Any]) -> None:
        self.base, self.rows = base, rows


class Written:
    """What a write-through wrote: each row as it now is in the table (`unknown`: a row the
    writer could not give, and the remembered reads are read again)."""

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.unknown = False

    def add(self, row: T) -> T:
        """`row` as written; None: not known (the remembered reads of its table are stale)."""
        if row is None:
            self.unknown = True
        else:
            self.rows.append(row)
        return row


def _patch_window(patch: Patch, value: Any, rows: list[Any]) -> Any:
    new = patch(value[1], rows)
    return None if new is None else (value[0], new)


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
