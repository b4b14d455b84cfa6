"""Times on the command line: an ISO 8601 time (`2026-11-26T05:00`, `…Z`, `…+01:00`; without a
zone it is the local time) or a duration (`90m`, `2h`, `1h30m`, `45s`, `7d`) counted from now,
forward for deadlines (`--until`) and back for `--since`."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import click

_PART = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str) -> timedelta | None:
    """`1h30m` -> 90 minutes; None when `text` is not a duration."""
    s = text.strip().lower()
    if not s or _PART.sub("", s):
        return None
    total = timedelta()
    for n, unit in _PART.findall(s):
        total += timedelta(**{_UNITS[unit]: int(n)})
    return total


def parse_time(text: str, now: datetime, *, past: bool) -> datetime:
    """An aware datetime for `text` (see the module doc); ValueError when it is neither."""
    d = parse_duration(text)
    if d is not None:
        return now - d if past else now + d
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO time (2026-11-26T05:00Z) nor a duration (90m, 2h)"
        ) from None
    return t if t.tzinfo else t.astimezone()  # a zoneless time is the local one


class TimeParam(click.ParamType):
    """A click parameter taking what parse_time takes."""

    name = "time"

    def __init__(self, *, past: bool) -> None:
        self.past = past

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        from datetime import UTC

        try:
            return parse_time(str(value), datetime.now(UTC), past=self.past)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
