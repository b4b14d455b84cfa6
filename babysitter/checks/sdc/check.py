"""The SDC test as an agent check. Invasive: it runs only when named in agent.enabled_checks,
and then only while the GPUs are idle (no compute process on any GPU), so it never steals
cycles from a job; a node drained for validation is idle by definition."""

from __future__ import annotations

import time
from pathlib import Path

from babysitter.checks import nvml
from babysitter.checks.base import Check
from babysitter.checks.sdc.backends import BackendUnavailable
from babysitter.checks.sdc.runner import run_sdc
from babysitter.finding import Finding, Severity


def gpus_busy() -> list[int] | str:
    """Indexes of GPUs with compute processes (empty on a node without an NVML library), or why
    NVML could not tell. Not knowing is not "idle": the caller must treat it as busy, or the
    invasive test could run on GPUs that hold a job."""
    import pynvml

    try:
        devs, lost = nvml.devices()
    except nvml.NvmlUnavailable as exc:
        if exc.code is None:  # no NVML library at all: no GPU a job could be using
            return []
        return str(exc)
    except pynvml.NVMLError as exc:
        return f"NVML error listing GPUs: {exc}"
    if lost:
        return f"GPUs {[d.index for d in lost]} do not answer NVML"
    busy = []
    for d in devs:
        try:
            if pynvml.nvmlDeviceGetComputeRunningProcesses(d.handle):
                busy.append(d.index)
        except pynvml.NVMLError as exc:
            return f"cannot list the processes on {d.label}: {exc}"
    return busy


class SdcCheck(Check):
    name = "sdc.matmul"
    section = "sdc"
    interval_s = 3600.0
    timeout_s = 300.0
    invasive = True
    golden_unreadable = 0  # runs that could not read the stored golden digests

    def run(self) -> list[Finding]:
        busy = gpus_busy()
        if isinstance(busy, str):
            return [
                self.finding(
                    "host",
                    Severity.INFO,
                    "sdc.skipped_unknown",
                    f"SDC test skipped: cannot tell whether the GPUs are idle ({busy})",
                    error=busy,
                )
            ]
        if busy:
            return [
                self.finding(
                    "host",
                    Severity.INFO,
                    "sdc.skipped_busy",
                    f"SDC test skipped: GPUs {busy} are running jobs",
                )
            ]
        cfg = self.ctx.config.checks.sdc
        state = Path(self.ctx.config.agent.spool_path).parent
        try:
            res = run_sdc(
                cfg.backend, cfg.size, cfg.dtype, cfg.seed, state_dir=state, check_name=self.name
            )
        except BackendUnavailable as exc:
            # not a verdict on the GPUs either way: said, never read as a pass
            return [
                self.finding(
                    "host",
                    Severity.WARNING,
                    "sdc.backend_unavailable",
                    f"SDC test did not run: {exc}",
                    backend=cfg.backend,
                )
            ]
        unreadable = sum(f.code == "sdc.golden_unreadable" for f in res.findings)
        if unreadable:  # counted in the node's reports beside the warning finding
            self.golden_unreadable += unreadable
            self.metrics["sdc_golden_unreadable_total"] = self.golden_unreadable
        if res.devices:
            # throughput for the controller's straggler policy; kept in every report until the
            # next run, since the test itself runs rarely (hourly, on idle GPUs)
            self.metrics["perf_gflops"] = {
                "gpu_model": res.devices[0].model,
                "gflops": [round(d.gflops, 1) for d in res.devices],
                "measured_at": time.time(),
            }
        return res.findings
