"""A durable, bounded local queue of reports (SQLite) for when the controller is unreachable.
Oldest reports are dropped first when full, and counted."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any


class Spool:
    def __init__(self, path: Path, max_reports: int = 10_000) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_reports = max_reports
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=10, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS spool (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "report_id TEXT UNIQUE NOT NULL, body TEXT NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, n INTEGER)")
        self._db.commit()

    def put(self, report: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO spool (report_id, body) VALUES (?, ?)",
                (report["report_id"], json.dumps(report)),
            )
            over = self._size() - self.max_reports
            if over > 0:
                self._db.execute(
                    "DELETE FROM spool WHERE seq IN (SELECT seq FROM spool ORDER BY seq LIMIT ?)",
                    (over,),
                )
                self._bump("dropped", over)
            self._db.commit()

    def peek(self, n: int = 100) -> list[tuple[int, dict[str, Any]]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, body FROM spool ORDER BY seq LIMIT ?", (n,)
            ).fetchall()
        return [(seq, json.loads(body)) for seq, body in rows]

    def remove(self, seq: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM spool WHERE seq = ?", (seq,))
            self._bump("replayed", 1)
            self._db.commit()

    def _size(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM spool").fetchone()[0])

    def size(self) -> int:
        with self._lock:
            return self._size()

    def count(self, name: str, n: int = 1) -> None:
        """Bump a durable counter (e.g. "refused": reports the controller refused)."""
        with self._lock:
            self._bump(name, n)
            self._db.commit()

    def _bump(self, name: str, n: int) -> None:
        self._db.execute(
            "INSERT INTO counters (name, n) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET n = n + excluded.n",
            (name, n),
        )

    def counter(self, name: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT n FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        with self._lock:
            self._db.close()
