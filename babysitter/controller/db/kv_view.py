"""The tick's remembered read of the kv table, kept current through its own writes of it
(issue 52): a step that sets a value (the guard's state) and a later step that reads the
table (the guard's report) cost one write, not a write and the whole table read again."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

# the store's JSON column writes values so (store.py's engine); read back, json.loads
json_text = functools.partial(json.dumps, allow_nan=False)


@dataclass(frozen=True)
class KvRow:
    id: str  # the key (a write-through knows rows by id)
    value: Any


def kv_row(key: str, value: Any) -> KvRow:
    """The row as a read would return it (through the column's JSON)."""
    return KvRow(key, json.loads(json_text(value)))


def kv_patch(value: dict[str, Any], rows: list[KvRow]) -> dict[str, Any]:
    return {**value, **{r.id: r.value for r in rows}}
