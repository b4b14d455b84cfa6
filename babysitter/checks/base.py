"""The check interface, the signal scheduling and the runner.

A check is a class with a name, a default interval and timeout, and `run() -> list[Finding]`.
`babysitter.checks.all` lists every check and event source explicitly (gpud-style); nothing
registers itself on import.

Checks keep their own state between runs on `self` (counter deltas, flap windows); a check
instance lives as long as the agent. Checks report healthy components too (severity `ok`), so
the controller can tell "fault gone" from "not reported".

A check reads one or more *signals*, each on its own interval (its class's `signals`, the tier
table of its folder; rules in `babysitter.checks.tiers`: the fast tier for cheap reads of
job-killing faults, slower ones for the rest). The agent runs a check at its shortest signal
interval; `begin()` tells the check which signals are due, and
`keep()` remembers each signal's last findings so a run that reads only the fast signals still
reports everything. A one-shot run (`babysitter check`) reads every signal.

Event sources (NVML events) are separate: `EventSource.start(emit)` runs a thread
that calls `emit(findings)` as soon as something happens.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar

import msgspec

from babysitter.checks import tiers
from babysitter.finding import Action, Finding, Severity

if TYPE_CHECKING:
    from babysitter.checks.profile import Expectations, NodeProfile
    from babysitter.config import Config
    from babysitter.settings import CheckConfig


class CheckContext:
    """What a check may use: the whole config and the node's name. No I/O handles here."""

    def __init__(self, config: Config, node_name: str) -> None:
        self.config = config
        self.node_name = node_name
        self._profile: NodeProfile | None = None

    def __repr__(self) -> str:
        return f"CheckContext(node_name={self.node_name!r})"

    def check_config(self, section: str) -> CheckConfig | None:
        return getattr(self.config.checks, section, None)

    def expect(self) -> Expectations:
        """What the node's hardware profile (checks/profile.py) says the checks should find."""
        if self._profile is None:
            from babysitter.checks.profile import NodeProfile

            self._profile = NodeProfile(self.config)
        return self._profile.get()


class Check:
    name: ClassVar[str]  # e.g. "gpu.ecc" — also the Finding.check of what it reports
    section: ClassVar[str]  # [checks.<section>] config table it reads
    interval_s: ClassVar[float] = 60.0
    timeout_s: ClassVar[float] = 10.0
    invasive: ClassVar[bool] = False  # uses the GPUs (SDC, NCCL): only on idle/drained nodes
    # runs when the controller orders it (agent), never on its own interval
    ordered: ClassVar[bool] = False
    # signal -> interval, from the tier table in the check's folder (checks/<name>/tiers.py);
    # empty: one signal, "run", at interval_s
    signals: ClassVar[Mapping[str, tiers.Interval]] = {}

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        # numbers a check wants to ship with every report (e.g. GPU utilisation), by name
        self.metrics: dict[str, object] = {}
        # findings to send once, in an event report, instead of in every full report
        self.events: list[Finding] = []
        self.order: str | None = None  # the controller's order this run answers (ordered)
        self._next_due: dict[str, float] = {}
        self._kept: dict[tuple[str, object], list[Finding]] = {}
        self.tier = "slow"  # of the last run: "fast" when it read only fast-tier signals
        self._intervals: dict[str, float] | None = None
        self._ok: dict[str, Finding] = {}

    # ---- signals and tiers
    def signal_intervals(self) -> dict[str, float]:
        """Interval of each signal this check reads (tiers table + config overrides)."""
        if self._intervals is None:  # the config does not change while the check lives
            self._intervals = self._signal_intervals()
        return self._intervals

    def _signal_intervals(self) -> dict[str, float]:
        cfg = self.ctx.check_config(self.section)
        forced = cfg.interval_s if cfg is not None and cfg.interval_s else None
        table = self.signals
        if not table:
            return {"run": forced or self.interval_s}
        fast = self.ctx.config.agent.fast_interval_s
        overrides = cfg.signal_intervals if cfg is not None else {}
        out: dict[str, float] = {}
        for sig, v in table.items():
            v = overrides.get(f"{self.name}/{sig}", v)
            out[sig] = forced or (fast if v == tiers.FAST else float(v))
        return out

    def fast_signals(self) -> set[str]:
        fast = self.ctx.config.agent.fast_interval_s
        return {s for s, v in self.signal_intervals().items() if v <= fast}

    def begin(self, now: float | None = None) -> set[str]:
        """The signals due now (all of them on the first run); schedules their next read."""
        now = time.monotonic() if now is None else now
        intervals = self.signal_intervals()
        # a little slack so a signal on a multiple of the run interval is not skipped by jitter
        slack = 0.5 * min(intervals.values())
        due = {s for s in intervals if now + slack >= self._next_due.get(s, 0.0)}
        for s in due:
            # on the grid the agent runs checks on (see Agent.run_due_checks), not `now +
            # interval`: a first read between two grid points would otherwise be skipped at the
            # next one (too early by less than the slack) and a fault seen up to 1.5 intervals late
            self._next_due[s] = (math.floor(now / intervals[s]) + 1) * intervals[s]
        self.tier = "fast" if due <= self.fast_signals() else "slow"
        return due

    def keep(self, signal: str, key: object, findings: list[Finding]) -> None:
        """Remember what `signal` found for `key` (a device, a port) until it is read again."""
        self._kept[(signal, key)] = findings

    def kept(self, key: object) -> list[Finding]:
        """Everything the signals last found for `key`, in signal order."""
        return [f for s in self.signal_intervals() for f in self._kept.get((s, key), [])]

    def forget(self, key: object) -> None:
        for k in [k for k in self._kept if k[1] == key]:
            del self._kept[k]

    def take_events(self) -> list[Finding]:
        out, self.events = self.events, []
        return out

    def before_gpu_reset(self) -> None:
        """A GPU reset is about to begin: a check that reads a log reads it up to now first,
        so what was logged before the reset is known to be from before it."""

    def gpu_was_reset(self, gpu: int, before: float) -> None:
        """GPU `gpu` was reset (the reset began at `before`, a wall clock time): what a check
        keeps across runs about it from before then is over. Polled reads see the GPU anew;
        only a check that remembers faults (the kernel log's XIDs) has something to drop."""

    def supported(self) -> bool:
        """False when the hardware/software this check needs is absent (reported, not fatal)."""
        return True

    def run(self) -> list[Finding]:
        raise NotImplementedError

    def reconfigured(self) -> None:
        """The config was reloaded (babysitter/reload.py): intervals are worked out again;
        thresholds are read from the config at each run already."""
        self._intervals = None

    # effective settings: config overrides the class defaults
    def effective_interval(self) -> float:
        """How often the agent runs the check: its most frequent signal."""
        return min(self.signal_intervals().values())

    def effective_timeout(self) -> float:
        cfg = self.ctx.check_config(self.section)
        return (cfg.timeout_s if cfg and cfg.timeout_s else None) or self.timeout_s

    def enabled(self) -> bool:
        cfg = self.ctx.check_config(self.section)
        return cfg.enabled if cfg is not None else True

    def steady_ok(self, component: str, code: str, message: str, **details: object) -> Finding:
        """An `ok` finding, reused while nothing about it changes: the fast tier reports every
        healthy GPU and port every second, and building (validating) a fresh one each time was
        most of its cost. Its observed_at is when it was first seen ok."""
        prev = self._ok.get(component)
        if (
            prev is not None
            and prev.code == code
            and prev.message == message
            and prev.details == details
        ):
            return prev
        f = self.finding(component, Severity.OK, code, message, Action.NONE, **details)
        self._ok[component] = f
        return f

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


class EventSource:
    """Pushes findings as events happen (a thread per source, not per poll).

    Its own state (running, or degraded and why) is `health()`: findings the agent puts in
    every report, replaced (not kept like events) whenever the source calls `set_health`;
    `on_health` is told at once."""

    name: ClassVar[str]

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.on_health: Callable[[EventSource, list[Finding]], None] | None = None
        self._health: list[Finding] = []
        self._health_lock = threading.Lock()

    def health(self) -> list[Finding]:
        with self._health_lock:
            return list(self._health)

    def set_health(self, findings: list[Finding]) -> None:
        with self._health_lock:
            self._health = list(findings)
        if self.on_health is not None:
            self.on_health(self, findings)

    def supported(self) -> bool:
        return True

    def start(self, emit: Callable[[list[Finding]], None]) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        pass


class CheckResult(msgspec.Struct):
    check: str
    findings: list[Finding]
    duration_s: float
    timed_out: bool = False
    error: str | None = None
    unknown: bool = False  # no verdict (timeout, crash)


class TierStats:
    """CPU seconds, NVML calls and runs per tier, for the agent's metrics (all threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cpu_s: dict[str, float] = {"fast": 0.0, "slow": 0.0}
        self.nvml_calls: dict[str, int] = {"fast": 0, "slow": 0}
        self.runs: dict[str, int] = {"fast": 0, "slow": 0}

    def add(self, tier: str, cpu_s: float, calls: int) -> None:
        with self.lock:
            self.cpu_s[tier] = self.cpu_s.get(tier, 0.0) + cpu_s
            self.nvml_calls[tier] = self.nvml_calls.get(tier, 0) + calls
            self.runs[tier] = self.runs.get(tier, 0) + 1

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self.lock:
            return {
                "cpu_s": {k: round(v, 6) for k, v in self.cpu_s.items()},
                "nvml_calls": dict(self.nvml_calls),
                "runs": dict(self.runs),
            }


TIER_STATS = TierStats()


def execute(check: Check) -> CheckResult:
    """Run a check in the calling thread: findings, or an error finding if it raised. Counts its
    CPU time and NVML calls towards the tier of what it read."""
    from babysitter.checks import nvml_counter

    start = time.monotonic()
    cpu0 = time.thread_time()
    calls0 = nvml_counter.calls()
    try:
        findings = check.run()
        err = None
    except Exception as exc:  # a check bug or bad input must not kill the run
        err = f"{type(exc).__name__}: {exc}"
        findings = []
    finally:
        TIER_STATS.add(check.tier, time.thread_time() - cpu0, nvml_counter.calls() - calls0)
    duration = time.monotonic() - start
    if err is not None:
        f = check.finding(
            "host",  # the check as a whole failed, not one component
            Severity.WARNING,
            "check.error",
            f"check {check.name} failed: {err}"[:2000],
            Action.INSPECT,
            error=err[:500],
        )
        return CheckResult(check.name, [f], duration, error=err, unknown=True)
    return CheckResult(check.name, findings, duration)


def timeout_result(check: Check, timeout: float, duration: float) -> CheckResult:
    f = check.finding(
        "host",  # the check as a whole failed, not one component
        Severity.CRITICAL,
        "check.timeout",
        f"check {check.name} did not finish within {timeout:g} s (hung driver or kernel call?)",
        Action.INSPECT,
        timeout_s=timeout,
    )
    return CheckResult(check.name, [f], duration, timed_out=True, unknown=True)


def run_check(check: Check, timeout_s: float | None = None) -> CheckResult:
    """Run one check in a daemon thread and give up after its timeout.

    A hung driver call cannot be interrupted from Python, so the thread is abandoned (daemon)
    and the hang becomes a finding; the caller must not start the same check again while
    `is_hung(check)` is true.
    """
    timeout = timeout_s if timeout_s is not None else check.effective_timeout()
    out: list[CheckResult] = []

    def target() -> None:
        try:
            out.append(execute(check))
        finally:
            _HUNG.discard(id(check))

    start = time.monotonic()
    _HUNG.add(id(check))
    t = threading.Thread(target=target, name=f"check:{check.name}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive() or not out:
        return timeout_result(check, timeout, time.monotonic() - start)
    return out[0]


_HUNG: set[int] = set()


def is_hung(check: Check) -> bool:
    return id(check) in _HUNG


def mark_hung(check: Check, hung: bool) -> None:
    """For callers that run checks in their own threads (the agent)."""
    if hung:
        _HUNG.add(id(check))
    else:
        _HUNG.discard(id(check))


def run_checks(checks: list[Check], deadline: float | None = None) -> list[CheckResult]:
    """Run checks concurrently, each under its own timeout (cut to what is left before
    `deadline`, a time.monotonic() value); the whole run ends within the longest timeout even
    when a driver call hangs."""
    results: list[CheckResult | None] = [None] * len(checks)

    def one(i: int) -> None:
        timeout = checks[i].effective_timeout()
        if deadline is not None:
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
        results[i] = run_check(checks[i], timeout)

    threads = [
        threading.Thread(target=one, args=(i,), name=f"run:{c.name}", daemon=True)
        for i, c in enumerate(checks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # run_check itself returns after the check's timeout
    return [r for r in results if r is not None]
