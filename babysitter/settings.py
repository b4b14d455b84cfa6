"""The base of every config model: `Section`, and `CheckConfig`, the keys every check
understands. Here, below both, so that each check's own settings (checks/<name>/settings.py)
and config.py, which assembles them into one `Config`, build on it without importing each
other."""

import functools
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, field


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A config section: keyword-only, unknown keys refused."""


def section_model(annotation: Any) -> type[Section] | None:
    """The Section an annotation is, else None."""
    return annotation if isinstance(annotation, type) and issubclass(annotation, Section) else None


def plain(annotation: Any) -> Any:
    """The type under Annotated[...] (constraints and descriptions stripped)."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


@functools.cache
def section_fields(model: type[Section]) -> Mapping[str, Any]:
    """A section's keys and their types (Annotated kept: descriptions and constraints).
    Cached: every BABYSITTER_* variable and every error message walks these, and resolving
    the annotations is the costly part."""
    hints = typing.get_type_hints(model, include_extras=True)
    return types.MappingProxyType({name: hints[name] for name in model.__struct_fields__})


class InvalidKey(ValueError):
    """A value check that needs code (a section's `__post_init__`) refused `key` (below the
    section; dotted into a dict entry): the config error names it without parsing any text."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


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
            raise InvalidKey(
                "signal_intervals", f'{", ".join(bad)}: an interval is seconds > 0 or "fast"'
            )
