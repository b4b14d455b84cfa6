"""The one vocabulary type that travels from a check to an alert: `Finding`.

Wire format and `--json` output are fixed by docs/architecture.md.

A plain class validated in `__init__`, neither a pydantic model nor a stdlib dataclass:
`babysitter check` runs as a Slurm HealthCheckProgram on every node every few minutes and is
measured against NHC's run. Importing pydantic alone costs more CPU than NHC's whole run, and
`dataclasses` imports `inspect` (with `ast`, `dis` and `tokenize`): a megabyte of the one-shot's
peak memory for code it never runs. The API still validates findings through pydantic (the
`Report` model holds `list[Finding]`): `__get_pydantic_core_schema__` gives pydantic the wire
form (`finding_fields()`, a newer agent's unknown keys ignored, each text's bounds in
pydantic-core) and then builds the finding through the same `__init__`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, NotRequired


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


# observed_at not given: now; details not given: {} (an explicit None is refused for both)
_NOW: Any = object()
_NO_DETAILS: Any = object()
_FIELD_NAMES = (
    "check",
    "component",
    "severity",
    "code",
    "message",
    "action",
    "observed_at",
    "details",
)


class Finding:
    """One observation of one component. Construction validates (ValueError on a bad field);
    immutable, compared and printed by its fields."""

    __slots__ = _FIELD_NAMES
    check: str  # check that produced it, e.g. gpu.ecc
    component: str  # host, gpuN, ib:<dev>/<port>, ...
    severity: Severity
    code: str  # stable machine code, e.g. ecc.dbe.volatile
    message: str
    action: Action
    observed_at: datetime
    details: dict[str, Any]

    def __init__(
        self,
        *,
        check: str,
        component: str,
        severity: Severity | str,
        code: str,
        message: str,
        action: Action | str = Action.NONE,
        observed_at: datetime | str = _NOW,
        details: dict[str, Any] = _NO_DETAILS,
    ) -> None:
        common = (  # one expression for the common case: ingest validates every finding
            type(check) is str
            and type(component) is str
            and type(code) is str
            and type(message) is str
            and len(check) <= _MAX_CHECK
            and len(component) <= _MAX_COMPONENT
            and len(code) <= _MAX_CODE
            and len(message) <= _MAX_MESSAGE
            and _CHECK_RE.fullmatch(check)
            and _COMPONENT_RE.fullmatch(component)
        )
        if not common:  # find the field to name
            for text, value in zip(_TEXTS, (check, component, code, message), strict=True):
                text.check(value)
        # enums given as their text (a stored row, a test) become the enum; an unknown one
        # raises ValueError
        if type(severity) is not Severity:
            severity = Severity(severity)
        if type(action) is not Action:
            action = Action(action)
        when: object = utcnow() if observed_at is _NOW else observed_at
        if isinstance(when, str):
            when = datetime.fromisoformat(when)
        if not isinstance(when, datetime):
            raise ValueError("observed_at must be a date and time")
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        if details is _NO_DETAILS:
            details = {}
        elif not isinstance(details, dict):
            raise ValueError("details must be an object")
        _set = object.__setattr__
        _set(self, "check", check)
        _set(self, "component", component)
        _set(self, "severity", severity)
        _set(self, "code", code)
        _set(self, "message", message)
        _set(self, "action", action)
        _set(self, "observed_at", when)
        _set(self, "details", details)

    def _values(self) -> tuple[Any, ...]:  # in _FIELD_NAMES' order
        return (
            self.check,
            self.component,
            self.severity,
            self.code,
            self.message,
            self.action,
            self.observed_at,
            self.details,
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())  # a TypeError for its details dict, as a dataclass's

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELD_NAMES)
        return f"Finding({inner})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a Finding is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: a Finding is immutable")

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle without __setattr__
        return (_rebuild, self._values())

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """pydantic validates the wire form (`finding_fields()`: the field locations and error
        types of a 422), then builds the finding through `__init__`; a `Finding` passes as
        it is. Only the controller and the agent, which import pydantic, ever call this."""
        from pydantic_core import core_schema

        def build(value: Any, fields: Any) -> Finding:
            return value if isinstance(value, cls) else cls(**fields(value))

        return core_schema.no_info_wrap_validator_function(
            build,
            handler.generate_schema(finding_fields()),
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda f: f.to_json_dict()
            ),
        )

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
        """A copy with `changes`, validated as a new finding."""
        return Finding(**{**dict(zip(_FIELD_NAMES, self._values(), strict=True)), **changes})

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
            "observed_at": _utc_text(self.observed_at),
            "details": self.details,
        }


# observed_at's wire text by time (UTC ones only: equal means the same instant, which a time
# in another zone does not guarantee across a DST fold): an ok finding is reused run after run
# (Check.steady_ok) and goes out in every report with the same time
_UTC_TEXT: dict[datetime, str] = {}


def _utc_text(when: datetime) -> str:
    text = _UTC_TEXT.get(when) if when.tzinfo is UTC else None
    if text is None:
        text = when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if when.tzinfo is UTC:
            if len(_UTC_TEXT) >= 4096:  # bounded: the times of long-gone findings
                _UTC_TEXT.clear()
            _UTC_TEXT[when] = text
    return text


_FIELDS = frozenset(_FIELD_NAMES)


def _rebuild(*values: Any) -> Finding:
    return Finding.unchecked(**dict(zip(_FIELD_NAMES, values, strict=True)))


def finding_fields() -> Any:
    """The wire form of a finding as a TypedDict (the API's pydantic validation, its OpenAPI
    schema's `Finding`): one definition of the text bounds (`_Text`) for both sides. Built on
    first use: pydantic wants typing_extensions' TypedDict on Python < 3.12, which the one-shot
    never imports."""
    global _FINDING_FIELDS
    if _FINDING_FIELDS is None:
        from typing_extensions import TypedDict

        fields = TypedDict(  # type: ignore[name-match]  # noqa: UP013  # built at run time
            "Finding",
            {
                "check": Annotated[str, _CHECK],
                "component": Annotated[str, _COMPONENT],
                "severity": Severity,
                "code": Annotated[str, _CODE],
                "message": Annotated[str, _MESSAGE],
                "action": NotRequired[Action],
                "observed_at": NotRequired[datetime],
                "details": NotRequired[dict[str, Any]],
            },
        )
        # a newer agent's finding fields are ignored, never refused (babysitter/wire.py)
        fields.__pydantic_config__ = {"extra": "ignore"}  # type: ignore[attr-defined]
        _FINDING_FIELDS = fields
    return _FINDING_FIELDS


_FINDING_FIELDS: Any = None


def worst(findings: Iterable[Finding]) -> Severity:
    sev = Severity.OK
    for f in findings:
        if f.severity > sev:
            sev = f.severity
    return sev


# Trust of a finding's source (docs/policy.md "Trust of finding sources"), defined once: the
# controller's policy, fabric correlation and remediation all ask these.

# Checks whose findings come from content a job's owner controls (its log files): evidence about
# the job, never about the node, its switch or its domain.
JOB_OWNED_CHECKS = frozenset({"nccl.logs"})
# what such a check says about the node itself, never read from a job's content: the job-log
# check could not learn which jobs run here (`scontrol listpids` failed), so it read nothing. A
# node-level warning (no drain, not a job's alert); it does not make the node's reports unknown
# for the resume: the node's own hardware checks still ran (docs/checks.md)
NODE_CODES_OF_JOB_CHECKS = frozenset({"nccl.logs_skipped"})


def job_owned(f: Finding | Mapping[str, Any]) -> bool:
    """THE predicate of job-owned evidence (invariant 3: it never drains a node on its own),
    for a finding or its stored form (the ingest's fold): a `job:<id>` component (the ingest's
    summary of folded job-owned findings included), or a job-log check's reading."""
    if isinstance(f, Finding):
        check, component, code = f.check, f.component, f.code
    else:
        check, component, code = str(f.get("check")), str(f.get("component")), str(f.get("code"))
    if component.startswith("job:"):
        return True
    return check in JOB_OWNED_CHECKS and code not in NODE_CODES_OF_JOB_CHECKS


def job_of(f: Finding | Mapping[str, Any]) -> str:
    """The job a job-owned finding speaks of, as a component-safe id ("unknown": none said)."""
    details = f.details if isinstance(f, Finding) else f.get("details") or {}
    component = f.component if isinstance(f, Finding) else str(f.get("component", ""))
    job = str(details.get("job_id") or component.removeprefix("job:"))
    return "".join(c for c in job if c.isascii() and c.isalnum())[:32] or "unknown"


# A check that crashed or timed out, or a source it could not read: it said nothing about the
# node. Such a report is unknown, never clean (no exit 0, no step towards a resume).
NO_VERDICT_CODES = frozenset(
    {
        "check.error",
        "check.timeout",
        # what the fabric and recovery checks could not tell (a service systemctl gave no
        # state for, an unparsable IMEX domain status, a fabric state, recovery action or
        # NVLink state babysitter does not know): a warning, and no clean step either
        "fabric_manager.unknown",
        "imex.unknown",
        "imex.domain_unknown",
        "fabric.state_unknown",
        "recovery.unknown",
        "nvlink.state_unknown",
    }
)
NO_VERDICT_SUFFIXES = (".nvml_error", ".unreadable")


def no_verdict(f: Finding) -> bool:
    return f.code in NO_VERDICT_CODES or f.code.endswith(NO_VERDICT_SUFFIXES)


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
