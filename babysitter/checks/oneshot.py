"""The one-shot run (`babysitter check`, Slurm's HealthCheckProgram), bounded as a whole.

A hung driver call cannot be interrupted from Python, and it can hang anywhere: in a check, or
already while finding which checks the node supports (that asks NVML too). So selection and
the checks run in a daemon thread, every check's timeout is cut to the run's budget, and
whatever has not finished by then is reported as a critical `check.timeout`. The caller must
then exit without waiting for the threads stuck in the driver (see `OneShot.hung`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec

from babysitter.checks.base import Check, CheckResult, execute, timeout_result
from babysitter.finding import Action, Finding, Severity

# Slurm runs the HealthCheckProgram every few minutes on every node: a run that hangs (100 s
# with one hung GPU before this bound) holds slurmd's health check and hides the verdict.
# The drain/resume that follows has its own bound (slurm.timeout_s).
BUDGET_S = 10.0
# run_checks returns by the deadline; this is only for a thread scheduled late on a busy node
_GRACE_S = 0.5


class OneShot(msgspec.Struct):
    results: list[CheckResult]
    hung: bool  # a thread is stuck in a call that will not return: do not wait for it at exit


def run_all(checks: list[Check], deadline: float) -> list[CheckResult]:
    """`run_checks` for a run that ends: every check in its own thread under its own timeout,
    cut to `deadline`, without `run_checks`' second, waiting thread per check (this thread
    waits for them all; each thread costs the one-shot memory it is measured by)."""
    start = time.monotonic()
    started: list[tuple[Check, threading.Thread, float, list[CheckResult]]] = []
    for check in checks:
        out: list[CheckResult] = []
        timeout = max(0.0, min(check.effective_timeout(), deadline - start))
        t = threading.Thread(
            target=lambda c=check, o=out: o.append(execute(c)),
            name=f"check:{check.name}",
            daemon=True,
        )
        t.start()
        started.append((check, t, timeout, out))
    results = []
    for check, t, timeout, out in started:
        t.join(max(0.0, start + timeout - time.monotonic()))
        results.append(out[0] if out else timeout_result(check, timeout, time.monotonic() - start))
    return results


def run_once(select: Callable[[], list[Check]], budget_s: float = BUDGET_S) -> OneShot:
    """Select the checks (`select`, which may ask the driver) and run them within `budget_s`;
    never blocks longer than that."""
    deadline = time.monotonic() + budget_s
    box: dict[str, object] = {}

    def work() -> None:
        try:
            checks = select()
            box["checks"] = checks
            box["results"] = run_all(checks, deadline)
        except BaseException as exc:  # re-raised in the caller's thread (UsageError, ...)
            box["error"] = exc

    t = threading.Thread(target=work, name="check:one-shot", daemon=True)
    t.start()
    t.join(budget_s + _GRACE_S)
    error = box.get("error")
    if isinstance(error, BaseException):
        raise error
    results = box.get("results")
    if isinstance(results, list):
        return OneShot(results, hung=any(r.timed_out for r in results))
    checks = box.get("checks")
    if isinstance(checks, list):  # selected, but the run itself overran (a starved thread)
        return OneShot([timeout_result(c, budget_s, budget_s) for c in checks], hung=True)
    stuck = Finding(
        check="babysitter.check",
        component="host",
        severity=Severity.CRITICAL,
        code="check.timeout",
        message=(
            f"the checks did not start within {budget_s:g} s: a driver or kernel call hung "
            "while finding which checks this node supports"
        ),
        action=Action.INSPECT,
        details={"timeout_s": budget_s},
    )
    return OneShot([CheckResult(stuck.check, [stuck], budget_s, True, None, True)], hung=True)
