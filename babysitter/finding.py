"""The one vocabulary type that travels from a check to an alert: `Finding`.

Wire format and `--json` output are fixed by DESIGN.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


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


def utcnow() -> datetime:
    return datetime.now(UTC)


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    check: str = Field(max_length=64, description="check that produced it, e.g. gpu.ecc")
    component: str = Field(max_length=128, description="host, gpuN, ib:<dev>/<port>, ...")
    severity: Severity
    code: str = Field(max_length=128, description="stable machine code, e.g. ecc.dbe.volatile")
    message: str = Field(max_length=2000)
    action: Action = Action.NONE
    observed_at: datetime = Field(default_factory=utcnow)
    details: dict[str, Any] = Field(default_factory=dict)

    @field_validator("check")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _CHECK_RE.match(v):
            raise ValueError("check must look like 'gpu.ecc' (lowercase, dot-separated)")
        return v

    @field_validator("component")
    @classmethod
    def _component_name(cls, v: str) -> str:
        if not _COMPONENT_RE.match(v):
            raise ValueError(
                "component must be host, cpu, gpuN, ib:<dev>/<port>, nvlink:gpuN/<link> or job:<id>"
            )
        return v

    @field_validator("observed_at")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        return v if v.tzinfo else v.replace(tzinfo=UTC)

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity of the condition (for dedup and open/closed tracking)."""
        return (self.check, self.component, self.code)

    def to_json_dict(self) -> dict[str, Any]:
        d = self.model_dump(mode="json")
        d["observed_at"] = self.observed_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return d


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
