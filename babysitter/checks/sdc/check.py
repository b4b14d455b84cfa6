"""The SDC test as an agent check. On by default, but the agent never starts it on its own: the
controller orders it (loop/sdc/schedule.py) for an idle node it has put under a short
Slurm hold, so no job can start on the GPUs while the test runs. Right before it takes the
GPUs the check asks NVML once more whether any GPU is in use, and skips (saying why) when one
is or when it cannot tell. `babysitter check --only sdc.matmul` runs it directly (an Epilog or
a job of its own may do that: docs/checks.md, "Periodic SDC tests").

A run leaves, besides the per-device verdicts the agent keeps reporting until the next run,
one `info` finding sent once (the run's summary with GFLOP/s per device, so it lands in the
node's history) and `metrics.sdc` (what the controller's schedule reads: which order ran, when,
with which backend, and the result).

The matmul itself runs in a short-lived child process (child.py): the agent never loads torch
or cupy and never holds a CUDA context."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from babysitter.checks.base import Check
from babysitter.checks.sdc.occupancy import occupancy
from babysitter.finding import Action, Finding, Severity


class SdcCheck(Check):
    name = "sdc.matmul"
    section = "sdc"
    interval_s = 4 * 3600.0  # the controller's schedule decides; see [checks.sdc] interval_s
    timeout_s = 300.0
    invasive = True
    ordered = True
    golden_unreadable = 0  # runs that could not read the stored golden digests

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_findings: list[Finding] = []  # kept when a run is skipped
        # tells the controller this agent takes SDC orders (controller/loop/sdc/schedule.py
        # READY_KEY): a node whose agent does not is never held for nothing
        self.metrics["sdc_ready"] = True

    def run(self) -> list[Finding]:
        order, self.order = self.order, None
        started = time.time()
        occ = occupancy()
        why = occ.why_not()
        if why:
            # the previous verdict stands: a skipped run must not clear a failed one
            code = "sdc.skipped_unknown" if occ.unknown else "sdc.skipped_busy"
            return self._skipped(order, started, code, why) + self.last_findings
        from babysitter.checks.sdc import child

        cfg = self.ctx.config.checks.sdc
        req = child.ChildRequest(
            cfg.backend,
            cfg.size,
            cfg.dtype,
            cfg.seed,
            inject=_inject(cfg.inject),
            state_dir=str(Path(self.ctx.config.agent.spool_path).parent),
            check_name=self.name,
        )
        try:
            out = child.run_child(req, self.child_timeout(), cfg.max_rss_mb)
        except child.ChildFailed as exc:
            return self._no_verdict(order, started, exc)
        res = out.reply
        if not res.ok:
            if res.error != "backend_unavailable":
                return self._no_verdict(order, started, child.ChildFailed(res.message))
            # no backend that can use the GPUs: a run on the CPU would report them verified
            f = self.finding(
                "host",
                Severity.WARNING,
                "sdc.backend_unavailable",
                f"SDC test cannot run: {res.message}",
                Action.INSPECT,
            )
            # kept in every report (an open problem) rather than sent once
            self._summary(order, started, f, ran=False, once=False)
            self.last_findings = [f]
            return [f]
        finished = time.time()
        findings = out.findings
        unreadable = sum(f.code == "sdc.golden_unreadable" for f in findings)
        if unreadable:  # counted in the node's reports beside the warning finding
            self.golden_unreadable += unreadable
            self.metrics["sdc_golden_unreadable_total"] = self.golden_unreadable
        gflops = {r.label: round(r.gflops, 1) for r in res.devices}
        failed = [f for f in findings if f.severity > Severity.OK]
        verdict = "FAILED on " + ", ".join(f.component for f in failed) if failed else "passed"
        summary = self.finding(
            "host",
            Severity.INFO,
            "sdc.failed" if failed else "sdc.passed",
            f"SDC test {verdict}: {len(res.devices)} device(s), {res.size}x{res.size} "
            f"{res.dtype} matmul on {res.library}, {min(gflops.values(), default=0):.0f} GFLOP/s "
            "slowest device",
            backend=res.backend,
            library=res.library,
            gflops=gflops,
            devices=[r.label for r in res.devices],
            size=res.size,
            dtype=res.dtype,
            started_at=started,
            finished_at=finished,
            order=order,
            child_peak_rss_mb=round(out.peak_rss_kb / 1024, 1),
        )
        self._summary(order, started, summary, ran=True, finished=finished, gflops=gflops)
        if res.devices:
            # throughput for the controller's straggler policy; kept in every report until the
            # next run, since the test itself runs rarely
            self.metrics["perf_gflops"] = {
                "gpu_model": res.devices[0].model,
                "gflops": [round(d.gflops, 1) for d in res.devices],
                "measured_at": finished,
            }
        self.last_findings = findings
        return findings

    def child_timeout(self) -> float:
        """The child is killed a little before the agent would call the whole check hung, so
        the run ends with its own finding (and the controller's hold is released)."""
        t = self.effective_timeout()
        return max(1.0, t - min(10.0, 0.1 * t))

    def _no_verdict(self, order: str | None, started: float, exc: Exception) -> list[Finding]:
        """The test gave no verdict (its child crashed, was killed, or sent nonsense): never
        a pass. The devices' previous verdicts stand beside it (a failed one is not cleared)."""
        timed_out = getattr(exc, "timed_out", False)
        f = self.finding(
            "host",
            Severity.CRITICAL if timed_out else Severity.WARNING,
            "check.timeout" if timed_out else "check.error",  # finding.no_verdict codes
            f"SDC test gave no verdict: {exc}"[:2000],
            Action.INSPECT,
            error=str(exc)[:500],
        )
        self._summary(order, started, f, ran=False, once=False)
        return [f] + [x for x in self.last_findings if x.component != "host"]

    def _skipped(self, order: str | None, started: float, code: str, why: str) -> list[Finding]:
        f = self.finding("host", Severity.INFO, code, f"SDC test not run: {why}", order=order)
        self._summary(order, started, f, ran=False)
        return []

    def _summary(
        self,
        order: str | None,
        started: float,
        f: Finding,
        ran: bool,
        finished: float | None = None,
        gflops: dict[str, float] | None = None,
        once: bool = True,
    ) -> None:
        """Publish the run in metrics.sdc; `once`: send `f` once (an event report)."""
        if once:
            self.events.append(f)
        self.metrics["sdc"] = {
            "order": order,
            "ran": ran,
            "code": f.code,
            "message": f.message[:300],
            "library": f.details.get("library"),
            "started_at": started,
            "finished_at": finished or time.time(),
            "gflops": gflops or {},
        }


def _inject(v: list[int] | None) -> tuple[int, int, int, int] | None:
    if not v:
        return None
    d, i, j, bit = v  # the config holds exactly four (SdcCheckConfig)
    return (d, i, j, bit)
