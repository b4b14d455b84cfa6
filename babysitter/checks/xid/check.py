"""XIDs, two ways: the kernel log (this check; the line formats in kmsg.py) and NVML critical-error
events (events.py). The names other modules import from here stay here (re-exported)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from babysitter.checks import nvml, tiers, unparsed
from babysitter.checks.base import Check
from babysitter.checks.nccl.local_jobs import jobs_on_node
from babysitter.checks.xid.events import (
    EVENT_FINDINGS,
    EVENT_RECOVERY_ACTION,
    EVENT_SBE,
    EVENT_XID,
    FAULT_EVENTS,
    NvmlEvents,
    NvmlXidEvents,
)
from babysitter.checks.xid.finding import xid_finding
from babysitter.checks.xid.kmsg import (
    MARKERS,
    MAX_LINE,
    OFF_BUS_RE,
    XID_RE,
    KmsgLine,
    KmsgReader,
    parse_kmsg,
    parse_kmsg_line,
    read_devkmsg,
    read_log_lines,
    slurm_job_of,
)
from babysitter.finding import Action, Finding, Severity
from babysitter.hardware import sticky
from babysitter.hardware.xids import XidClass, classify

if TYPE_CHECKING:
    import logging

__all__ = [
    "EVENT_FINDINGS",
    "EVENT_RECOVERY_ACTION",
    "EVENT_SBE",
    "EVENT_XID",
    "FAULT_EVENTS",
    "MARKERS",
    "MAX_LINE",
    "OFF_BUS_RE",
    "XID_RE",
    "KmsgXidCheck",
    "NvmlEvents",
    "NvmlXidEvents",
    "parse_kmsg",
    "parse_kmsg_line",
    "read_log_lines",
    "xid_finding",
]


def _log() -> logging.Logger:
    # imported when there is something to say: `babysitter check` imports this module, and
    # logging's import is a few percent of its whole memory budget
    import logging

    return logging.getLogger(__name__)


# A follow-on XID (45: the driver tearing down the channels of a context another XID already
# killed) comes within the same second or two as the XID that caused it; 10 s covers a slow
# teardown of many channels while staying far below the minutes between two unrelated faults.
FOLLOW_ON_WINDOW_S = 10.0


def _norm_pci(pci: str) -> str:
    """'0000:3b:00' / '00000000:3B:00.0' -> '3b:00' (bus:device) for matching."""
    parts = pci.lower().split(":")
    if len(parts) >= 2:
        return f"{parts[-2][-2:]}:{parts[-1].split('.')[0][:2]}"
    return pci.lower()


class KmsgXidCheck(Check):
    """XIDs from the kernel log (agent.kmsg_path). Remembers how far it read."""

    name = "xid.kmsg"
    section = "xid"
    # the fast tier: some faults reach only the kernel log (a GPU that fell off the bus, said
    # by the driver's device print with no Xid and no NVML event) and must drain within a
    # second; a run reads only the records written since the last one, so it costs ~nothing
    signals: ClassVar[Mapping[str, tiers.Interval]] = {"kmsg": tiers.FAST}
    timeout_s = 10.0
    proc_root = Path("/proc")  # where a blamed pid's cgroup is read (tests point it elsewhere)

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._offset = 0
        # open until the next reboot, or a reset of that GPU, those the table gives a reason
        # to stay (hardware/sticky.py); a job's XID until its job ends (the agent's reset thread
        # drops them while a run may be adding: one lock)
        self._open: dict[tuple[str, str], Finding] = {}
        self._open_lock = threading.Lock()
        # one reader of the log at a time: a run, or a reset's catch-up (before_gpu_reset),
        # whose said-once findings wait here for the next run
        self._read_lock = threading.Lock()
        self._caught: dict[tuple[str, str], Finding] = {}
        self.malformed_lines = 0
        self._reader = KmsgReader()
        # per component: the last XID that was not a follow-on one, and when (kernel seconds)
        self._last_xid: dict[str, tuple[int, float]] = {}
        # when a line has no kernel timestamp: the time it is read (a simulation's own clock)
        self.clock: Callable[[], float] = time.monotonic
        # the ids of the jobs running on this node (None: unknown); asked only while a
        # job-attributable XID is open (tests and simulations replace it)
        sl = self.ctx.config.slurm
        scontrol = str(sl.bin_dir / "scontrol") if sl.bin_dir else "scontrol"
        conf = str(sl.slurm_conf) if sl.slurm_conf else None
        self.local_jobs: Callable[[], frozenset[str] | None] = lambda: jobs_on_node(
            self.ctx.node_name, scontrol, conf
        )

    def _pci_to_gpu(self) -> dict[str, nvml.Device]:
        try:
            devs, _ = nvml.devices()
        except Exception:
            return {}
        return {_norm_pci(d.pci): d for d in devs}

    def _follows(self, comp: str, line: KmsgLine, now: float) -> int | None:
        """The XID a follow-on XID belongs to: the one the driver names ("caused by previous
        Xid N"), else the last other XID on the same GPU within the window."""
        if line.follows_xid is not None:
            return line.follows_xid
        last = self._last_xid.get(comp)
        if last is not None and 0.0 <= now - last[1] <= FOLLOW_ON_WINDOW_S:
            return last[0]
        return None

    def _job_details(self, line: KmsgLine) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if line.pid is not None:
            out["pid"] = line.pid
            job = slurm_job_of(line.pid, self.proc_root)
            if job is not None:
                out["job_id"] = job
        if line.name is not None:
            out["process"] = line.name
        return out

    def _line_finding(
        self, pci_map: dict[str, nvml.Device], overrides: dict[int, XidClass], line: KmsgLine
    ) -> Finding:
        pci = line.pci or "unknown"
        dev = pci_map.get(_norm_pci(line.pci)) if line.pci else None
        gpu = dev.index if dev is not None else None
        comp = f"gpu{gpu}" if gpu is not None else "host"
        where = f"GPU {gpu} (PCI {pci})" if gpu is not None else f"PCI {pci}"
        # the board's identity, for the lemon ledger (a renamed node keeps its GPU's history)
        ids: dict[str, Any] = (
            {"uuid": dev.uuid, **({"serial": dev.serial} if dev.serial else {})} if dev else {}
        )
        if line.xid is None:
            return self.finding(
                comp,
                Severity.CRITICAL,
                "gpu.fallen_off_bus",
                f"{where}: GPU has fallen off the bus (kernel log)",
                Action.REBOOT,
                pci_bus_id=pci,
                rule="kmsg: fallen off the bus",
                **ids,
            )
        now = line.stamp if line.stamp is not None else self.clock()
        v = classify(line.xid, overrides, line.text)
        extra: dict[str, Any] = {"mig": line.mig} if line.mig else {}
        if v.job_attributable:
            extra.update(self._job_details(line), job_attributable=True)
        follows = self._follows(comp, line, now) if v.follows_other else None
        if not v.follows_other:
            self._last_xid[comp] = (line.xid, now)
        f = xid_finding(
            self.name,
            line.xid,
            overrides,
            comp,
            where,
            line.text,
            pci_bus_id=pci,
            source="kmsg",
            **extra,
            **ids,
        )
        if follows is None:
            return f
        # attributed to the XID it follows: evidence about that one, never a new warning
        return f.replace(
            severity=min(f.severity, Severity.INFO, key=lambda s: s.rank),
            action=Action.NONE,
            details={**f.details, "follows_xid": follows},
        )

    def gpu_was_reset(self, gpu: int, before: float) -> None:
        """A reset of the GPU ended its XIDs logged before it (a reset-class XID 74 or 48 in
        the kernel log stayed open after a good reset: the node was drained again and again)."""
        comp = f"gpu{gpu}"
        with self._open_lock:
            for key in [
                k
                for k, f in self._open.items()
                if f.component == comp and f.observed_at.timestamp() < before
            ]:
                del self._open[key]

    def _read_new(self, path: Path) -> list[str]:
        with open(path, "rb") as fh:
            if path.is_file():
                size = path.stat().st_size
                if size < self._offset:  # rotated / truncated: start over
                    self._offset = 0
                new, self._offset = read_log_lines(fh, self._offset)
                return new
            return read_devkmsg(fh)  # /dev/kmsg: non-blocking reads of whole records

    def before_gpu_reset(self) -> None:
        """Read the log up to now before a reset begins: a line the kernel logged before the
        reset is then stamped before it too, and the reset ends it, however late the fast
        tier would have come (it came after the reset had begun, and the reset rung failed
        on an XID 74 it had cleared)."""
        with self._read_lock:
            got = self._ingest()
            if isinstance(got, dict):
                self._caught.update(got)

    def _ingest(self) -> dict[tuple[str, str], Finding] | list[Finding]:
        """Read and parse the lines written since the last read: the findings said by these
        lines only (the kept ones go to `_open`), or a finding saying the log is unreadable."""
        path = Path(self.ctx.config.agent.kmsg_path)
        overrides = self.ctx.config.checks.xid.overrides
        try:
            new = self._read_new(path)
        except FileNotFoundError:
            return [self.finding("host", Severity.OK, "kmsg.absent", f"{path} does not exist")]
        except OSError as exc:
            return [
                self.finding(
                    "host",
                    Severity.WARNING,
                    "kmsg.unreadable",
                    f"cannot read {path}: {exc}",
                    Action.INSPECT,
                )
            ]
        pci_map: dict[str, nvml.Device] | None = None
        once: dict[tuple[str, str], Finding] = {}  # said by this read only: no reason to stay
        for raw in new:
            # each line under its own error boundary: the offset has already moved past these
            # lines, so one that breaks the parser must not lose the real XIDs after it
            try:
                found = []
                for line in self._reader.feed(raw):
                    if pci_map is None:
                        pci_map = self._pci_to_gpu()
                    found.append(self._line_finding(pci_map, overrides, line))
            except Exception:
                self.malformed_lines += 1
                _log().warning("skipped a kernel-log line that could not be parsed: %.200r", raw)
                continue
            with self._open_lock:
                for f in found:
                    kept = _to_keep(f)
                    if kept is not None:
                        self._open[(f.component, f.code)] = kept
                    elif f.severity >= Severity.WARNING:
                        once[(f.component, f.code)] = f
        return once

    def run(self) -> list[Finding]:
        self.begin()  # one signal, read every run; this keeps the tier's bookkeeping
        with self._read_lock:
            got = self._ingest()
            if not isinstance(got, dict):
                return got
            once, self._caught = {**self._caught, **got}, {}
        if self.malformed_lines:
            self.metrics["kmsg_malformed_lines"] = self.malformed_lines
        seen = unparsed.REGISTRY.snapshot()
        if seen:
            self.metrics["unparsed_lines"] = seen
        self._end_with_their_jobs()
        with self._open_lock:
            still = list(self._open.values())
            still += [f for k, f in once.items() if k not in self._open]
        return still or [self.finding("host", Severity.OK, "xid.none", "no XIDs in the kernel log")]

    def _end_with_their_jobs(self) -> None:
        """A job-attributable XID (the application's fault, NVIDIA's RESTART_APP) is evidence
        about its job: it ends when that job no longer runs here, or, when the line named no
        job this node could map, when the node runs no job at all. Otherwise it would stay
        open until a reboot and, after a week, every node would show a warning. The job list
        unknown: nothing ends (an error never reads as the job having ended)."""
        with self._open_lock:
            blamed = [k for k, f in self._open.items() if f.details.get("job_attributable")]
        if not blamed:
            return
        running = self.local_jobs()
        if running is None:
            return
        with self._open_lock:
            for key in blamed:
                f = self._open.get(key)
                if f is None:
                    continue
                job = f.details.get("job_id")
                if (str(job) not in running) if job is not None else not running:
                    del self._open[key]


def _to_keep(f: Finding) -> Finding | None:
    """`f` as kept open with its stated reason (`sticky_reason`), or None: reported by this
    run only (an inspect-class or unknown XID: a human looks at the one report)."""
    if f.severity >= Severity.WARNING and f.details.get("job_attributable"):
        return sticky.with_reason(f, sticky.JOB_REASON)  # ended with its job, below
    why = sticky.reason(f)
    return None if why is None else sticky.with_reason(f, why)


_read_devkmsg = read_devkmsg  # the older name
