"""The check interface, the registry and the runner.

A check is a class with a name, a default interval and timeout, and `run() -> list[Finding]`.
Register it with `@register`; `babysitter.checks.all` imports every check module explicitly
(gpud-style), so the registry is complete once that module is imported.

Checks keep their own state between runs on `self` (counter deltas, flap windows); a check
instance lives as long as the agent. Checks report healthy components too (severity `ok`), so
the controller can tell "fault gone" from "not reported".

Event sources (NVML events, kmsg follow) are separate: `EventSource.start(emit)` runs a thread
that calls `emit(findings)` as soon as something happens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from babysitter.finding import Action, Finding, Severity

if TYPE_CHECKING:
    from babysitter.config import CheckConfig, Config


@dataclass
class CheckContext:
    """What a check may use: the whole config and the node's name. No I/O handles here."""

    config: Config
    node_name: str

    def check_config(self, section: str) -> CheckConfig | None:
        return getattr(self.config.checks, section, None)


class Check:
    name: ClassVar[str]  # e.g. "gpu.ecc" — also the Finding.check of what it reports
    section: ClassVar[str]  # [checks.<section>] config table it reads
    interval_s: ClassVar[float] = 60.0
    timeout_s: ClassVar[float] = 10.0
    invasive: ClassVar[bool] = False  # uses the GPUs (SDC, NCCL): only on idle/drained nodes

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        # numbers a check wants to ship with every report (e.g. GPU utilisation), by name
        self.metrics: dict[str, object] = {}

    def supported(self) -> bool:
        """False when the hardware/software this check needs is absent (reported, not fatal)."""
        return True

    def run(self) -> list[Finding]:
        raise NotImplementedError

    # effective settings: config overrides the class defaults
    def effective_interval(self) -> float:
        cfg = self.ctx.check_config(self.section)
        return (cfg.interval_s if cfg and cfg.interval_s else None) or self.interval_s

    def effective_timeout(self) -> float:
        cfg = self.ctx.check_config(self.section)
        return (cfg.timeout_s if cfg and cfg.timeout_s else None) or self.timeout_s

    def enabled(self) -> bool:
        cfg = self.ctx.check_config(self.section)
        return cfg.enabled if cfg is not None else True

    def finding(
        self,
        component: str,
        severity: Severity,
        code: str,
        message: str,
        action: Action = Action.NONE,
        **details: object,
    ) -> Finding:
        return Finding(
            check=self.name,
            component=component,
            severity=severity,
            code=code,
            message=message,
            action=action,
            details=dict(details),
        )


REGISTRY: dict[str, type[Check]] = {}


def register(cls: type[Check]) -> type[Check]:
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"duplicate check name {cls.name}")
    REGISTRY[cls.name] = cls
    return cls


class EventSource:
    """Pushes findings as events happen (a thread per source, not per poll)."""

    name: ClassVar[str]

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx

    def supported(self) -> bool:
        return True

    def start(self, emit: Callable[[list[Finding]], None]) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        pass


EVENT_SOURCES: dict[str, type[EventSource]] = {}


def register_event_source(cls: type[EventSource]) -> type[EventSource]:
    EVENT_SOURCES[cls.name] = cls
    return cls


@dataclass
class CheckResult:
    check: str
    findings: list[Finding]
    duration_s: float
    timed_out: bool = False
    error: str | None = None
    unknown: bool = False  # no verdict (timeout, crash)


def run_check(check: Check, timeout_s: float | None = None) -> CheckResult:
    """Run one check in a daemon thread and give up after its timeout.

    A hung driver call cannot be interrupted from Python, so the thread is abandoned (daemon)
    and the hang becomes a finding; the caller must not start the same check again while
    `is_hung(check)` is true.
    """
    timeout = timeout_s if timeout_s is not None else check.effective_timeout()
    out: dict[str, object] = {}

    def target() -> None:
        try:
            out["findings"] = check.run()
        except Exception as exc:  # a check bug or bad input must not kill the run
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            _HUNG.discard(id(check))

    start = time.monotonic()
    _HUNG.add(id(check))
    t = threading.Thread(target=target, name=f"check:{check.name}", daemon=True)
    t.start()
    t.join(timeout)
    duration = time.monotonic() - start
    if t.is_alive():
        f = check.finding(
            "host",  # the check as a whole failed, not one component
            Severity.CRITICAL,
            "check.timeout",
            f"check {check.name} did not finish within {timeout:g} s (hung driver or kernel call?)",
            Action.INSPECT,
            timeout_s=timeout,
        )
        return CheckResult(check.name, [f], duration, timed_out=True, unknown=True)
    if "error" in out:
        err = str(out["error"])
        f = check.finding(
            "host",  # the check as a whole failed, not one component
            Severity.WARNING,
            "check.error",
            f"check {check.name} failed: {err}"[:2000],
            Action.INSPECT,
            error=err[:500],
        )
        return CheckResult(check.name, [f], duration, error=err, unknown=True)
    findings = out.get("findings") or []
    assert isinstance(findings, list)
    return CheckResult(check.name, findings, duration)


_HUNG: set[int] = set()


def is_hung(check: Check) -> bool:
    return id(check) in _HUNG


def run_checks(checks: list[Check]) -> list[CheckResult]:
    """Run checks concurrently, each under its own timeout; the whole run ends within the
    longest timeout even when a driver call hangs."""
    results: list[CheckResult | None] = [None] * len(checks)

    def one(i: int) -> None:
        results[i] = run_check(checks[i])

    threads = [
        threading.Thread(target=one, args=(i,), name=f"run:{c.name}", daemon=True)
        for i, c in enumerate(checks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # run_check itself returns after the check's timeout
    return [r for r in results if r is not None]
