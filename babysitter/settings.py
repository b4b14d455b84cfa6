"""The base of every config model: `Section`, and `CheckConfig`, the keys every check
understands. Here, below both, so that each check's own settings (checks/<name>/settings.py)
and config.py, which assembles them into one `Config`, build on it without importing each
other."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, field


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A config section: keyword-only, unknown keys refused."""


class CheckConfig(Section):
    """Keys every check understands."""

    enabled: Annotated[bool, Meta(description="run this check")] = True
    interval_s: Annotated[float, Meta(gt=0, description="override the check's interval")] | None = (
        None
    )
    timeout_s: Annotated[float, Meta(gt=0, description="override the check's timeout")] | None = (
        None
    )
    signal_intervals: Annotated[
        dict[str, float | Literal["fast"]],
        Meta(
            description='per-signal interval overrides, {"gpu.memory/sbe_volatile" = 30 | "fast"}'
        ),
    ] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = sorted(k for k, x in self.signal_intervals.items() if x != "fast" and not x > 0)
        if bad:
            raise ValueError(
                f'signal_intervals: {", ".join(bad)}: an interval is seconds > 0 or "fast"'
            )
