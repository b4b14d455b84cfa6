"""The one vocabulary type that travels from a check to an alert: `Finding`.

Wire format and `--json` output are fixed by docs/architecture.md.

A stdlib dataclass validated in `__post_init__`, not a pydantic model: `babysitter check` runs
as a Slurm HealthCheckProgram on every node every few minutes, and importing pydantic alone
costs more CPU than NHC's whole run. The API still validates it through pydantic (the `Report`
model holds `list[Finding]`): pydantic validates the fields of a stdlib dataclass, then runs
the same `__post_init__`, and `__pydantic_config__` makes it refuse unknown keys.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar


class Severity(StrEnum):
    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"  # the node must not run jobs

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]

    # THE order of severities. A plain string on the other side is read as a Severity (a
    # misspelled one raises ValueError): it must never compare as text ("critical" < "info").
    # Python asks these first even with the str on the left, Severity being a str subclass.
    def __ge__(self, other: object) -> bool:
        return self.rank >= _rank_of(other)

    def __gt__(self, other: object) -> bool:
        return self.rank > _rank_of(other)

    def __le__(self, other: object) -> bool:
        return self.rank <= _rank_of(other)

    def __lt__(self, other: object) -> bool:
        return self.rank < _rank_of(other)


def _rank_of(other: object) -> int:
    if isinstance(other, Severity):
        return other.rank
    if isinstance(other, str):
        return Severity(other).rank
    raise TypeError(f"cannot order a Severity against {type(other).__name__}")


_SEVERITY_RANK = {Severity.OK: 0, Severity.INFO: 1, Severity.WARNING: 2, Severity.CRITICAL: 3}


class Action(StrEnum):
    """What the finding recommends; policy decides what actually happens."""

    NONE = "none"
    WATCH = "watch"
    DRAIN = "drain"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    INSPECT = "inspect"
    REQUEUE_JOB = "requeue_job"


# host | gpuN | ib:<dev>/<port> | nvlink:gpuN/<link> | job:<id> | cpu (SDC on CPU backends)
_COMPONENT_RE = re.compile(
    r"^(host|cpu|gpu\d+|ib:[A-Za-z0-9_.\-]+/\d+|nvlink:gpu\d+/\d+|job:[0-9_A-Za-z.\-]+)$"
)
_CHECK_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$")
# longest text per field: a hostile or broken node cannot fill the store through one finding
MAX_LENGTH = {"check": 64, "component": 128, "code": 128, "message": 2000}
_MAX_CHECK, _MAX_COMPONENT, _MAX_CODE, _MAX_MESSAGE = MAX_LENGTH.values()


class _Text:
    """A text field's bounds, enforced twice from one definition: by `Finding.__post_init__`
    on the node and, as an Annotated marker, by pydantic where the field stands in the API's
    model (so a 422 names the field; pydantic_core is imported only when pydantic asks)."""

    def __init__(self, name: str, pattern: re.Pattern[str] | None = None, error: str = "") -> None:
        self.name, self.pattern, self.error = name, pattern, error
        self.max_length = MAX_LENGTH[name]

    def check(self, value: object) -> str:
        if not isinstance(value, str):
            raise ValueError(f"{self.name} must be a string")
        if len(value) > self.max_length:
            raise ValueError(f"{self.name} is longer than {self.max_length} characters")
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise ValueError(self.error)
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        # the same bounds in pydantic-core's own (Rust) checks: no Python call per field on
        # the controller's ingest path (`__post_init__` runs once per finding anyway)
        from pydantic_core import core_schema

        pattern = self.pattern.pattern if self.pattern is not None else None
        return core_schema.str_schema(max_length=self.max_length, pattern=pattern)


_CHECK = _Text("check", _CHECK_RE, "check must look like 'gpu.ecc' (lowercase, dot-separated)")
_COMPONENT = _Text(
    "component",
    _COMPONENT_RE,
    "component must be host, cpu, gpuN, ib:<dev>/<port>, nvlink:gpuN/<link> or job:<id>",
)
_CODE = _Text("code")
_MESSAGE = _Text("message")
_TEXTS = (_CHECK, _COMPONENT, _CODE, _MESSAGE)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One observation of one component. Construction validates (ValueError on a bad field)."""

    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}

    check: Annotated[str, _CHECK]  # check that produced it, e.g. gpu.ecc
    component: Annotated[str, _COMPONENT]  # host, gpuN, ib:<dev>/<port>, ...
    severity: Severity
    code: Annotated[str, _CODE]  # stable machine code, e.g. ecc.dbe.volatile
    message: Annotated[str, _MESSAGE]
    action: Action = Action.NONE
    observed_at: datetime = dataclasses.field(default_factory=utcnow)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        c, comp, code, msg = self.check, self.component, self.code, self.message
        common = (  # one expression for the common case: ingest validates every finding
            type(c) is str
            and type(comp) is str
            and type(code) is str
            and type(msg) is str
            and len(c) <= _MAX_CHECK
            and len(comp) <= _MAX_COMPONENT
            and len(code) <= _MAX_CODE
            and len(msg) <= _MAX_MESSAGE
            and _CHECK_RE.fullmatch(c)
            and _COMPONENT_RE.fullmatch(comp)
        )
        if not common:  # find the field to name
            for text in _TEXTS:
                text.check(getattr(self, text.name))
        # enums given as their text (a stored row, a test) become the enum; an unknown one
        # raises ValueError
        if type(self.severity) is not Severity:
            object.__setattr__(self, "severity", Severity(self.severity))
        if type(self.action) is not Action:
            object.__setattr__(self, "action", Action(self.action))
        when = self.observed_at
        if isinstance(when, str):
            when = datetime.fromisoformat(when)
        if not isinstance(when, datetime):
            raise ValueError("observed_at must be a date and time")
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        if when is not self.observed_at:
            object.__setattr__(self, "observed_at", when)
        if not isinstance(self.details, dict):
            raise ValueError("details must be an object")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Finding:
        """A finding from its JSON form (`to_json_dict`); ValueError when it does not validate
        (an unknown key included)."""
        if not isinstance(d, Mapping):
            raise ValueError("a finding is a JSON object")
        unknown = set(d) - _FIELDS
        if unknown:
            raise ValueError(f"unknown finding key(s): {', '.join(sorted(map(str, unknown)))}")
        try:
            return cls(**d)
        except TypeError as exc:  # a required key missing
            raise ValueError(str(exc)) from None

    @classmethod
    def unchecked(
        cls,
        *,
        check: str,
        component: str,
        severity: Severity,
        code: str,
        message: str,
        action: Action,
        observed_at: datetime,
        details: dict[str, Any],
    ) -> Finding:
        """A finding built without validation: only for rows the store wrote long ago that no
        longer validate (read rather than dropped; see store.stored_finding)."""
        f = object.__new__(cls)
        for name, value in (
            ("check", check),
            ("component", component),
            ("severity", severity),
            ("code", code),
            ("message", message),
            ("action", action),
            ("observed_at", observed_at),
            ("details", details),
        ):
            object.__setattr__(f, name, value)
        return f

    def replace(self, **changes: Any) -> Finding:
        return dataclasses.replace(self, **changes)

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of the condition (for dedup and open/closed tracking)."""
        return (self.check, self.component, self.code)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "component": self.component,
            "severity": self.severity.value,
            "code": self.code,
            "message": self.message,
            "action": self.action.value,
            "observed_at": self.observed_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "details": self.details,
        }


_FIELDS = frozenset(f.name for f in dataclasses.fields(Finding))


def worst(findings: Iterable[Finding]) -> Severity:
    sev = Severity.OK
    for f in findings:
        if f.severity > sev:
            sev = f.severity
    return sev


# Nagios / NHC exit codes
EXIT_OK, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNKNOWN = 0, 1, 2, 3


def exit_code(findings: Iterable[Finding], unknown: bool = False) -> int:
    """Nagios convention. `unknown` is set when a check could not produce a verdict."""
    sev = worst(findings)
    if sev is Severity.CRITICAL:
        return EXIT_CRITICAL
    if unknown:
        return EXIT_UNKNOWN
    if sev is Severity.WARNING:
        return EXIT_WARNING
    return EXIT_OK
