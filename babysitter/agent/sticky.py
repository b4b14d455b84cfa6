"""Event findings (XIDs, NVML events) that stay until the node reboots.

An XID 79 is reported once, by an event; the fault lasts until the node reboots. So the event
findings whose fault outlives the event (hardware/sticky.py: a table that says why, the reason
put in the finding's details as `sticky_reason`) are kept in a small JSON file beside the spool,
keyed by the kernel's boot id: an agent restart keeps them, a reboot (new boot id) forgets
them. The others are reported once, by their event report. A few can also be seen gone
before a reboot, where NVML can tell (`CLEARED_BY`: a GPU reset zeroes the volatile ECC
counters, so a DBE event is over once the fast tier reads the GPU's memory healthy again).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from babysitter.agent.statefile import read_json, write_atomically
from babysitter.finding import Finding
from babysitter.hardware import sticky as reasons

log = logging.getLogger(__name__)

# event finding code -> (polled check, its healthy code) that proves the condition is gone
CLEARED_BY: dict[str, tuple[str, str]] = {
    "ecc.dbe.event": ("gpu.memory", "memory.ok"),
    "retirement.failed": ("gpu.memory", "memory.ok"),
}


def read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


class StickyFindings:
    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = Path(path)
        self.boot_id = boot_id
        self._lock = threading.Lock()
        self.findings: dict[tuple[str, str, str], Finding] = {}
        self._load()

    def _load(self) -> None:
        data = read_json(self.path)
        if data is None:
            return
        if not isinstance(data, dict) or data.get("boot_id") != self.boot_id:
            log.info("node rebooted since %s was written: event findings cleared", self.path)
            self._save()
            return
        for raw in data.get("findings", []):
            try:
                f = Finding.from_dict(raw)
            except ValueError:
                continue
            # kept by an older agent without a reason (an application XID): not kept now
            why = reasons.reason(f)
            if why is not None:
                self.findings[f.key] = reasons.with_reason(f, why)

    def _save(self) -> None:
        body = json.dumps(
            {
                "boot_id": self.boot_id,
                "findings": [f.to_json_dict() for f in self.findings.values()],
            }
        )
        write_atomically(self.path, body, "event findings")

    def add(self, findings: list[Finding]) -> list[Finding]:
        """Keep those of these event findings that the table gives a reason to stay
        (hardware/sticky.py) until a reboot; the others (an application's XID 45 or 13, a
        corrected-error storm) the event report carries once. Kept, every XID 45 stayed a
        warning until a reboot (the soak: 30 % of nodes after 2 days). Returns the findings,
        those kept with their `sticky_reason`, for the event report."""
        out = [reasons.mark(f) for f in findings]
        kept = [f for f in out if reasons.REASON_KEY in f.details]
        if kept:
            with self._lock:
                for f in kept:
                    self.findings[f.key] = f
                self._save()
        return out

    def values(self) -> list[Finding]:
        with self._lock:
            return list(self.findings.values())

    def clear_gone(self, check: str, polled: list[Finding], run_started_at: float) -> int:
        """Drop the event findings that `check`'s run (started at `run_started_at`, a wall
        clock time) saw healthy; only runs that began after the event count."""
        healthy = {(f.component, f.code) for f in polled}
        with self._lock:
            gone = [
                k
                for k, f in self.findings.items()
                if f.code in CLEARED_BY
                and CLEARED_BY[f.code][0] == check
                and (f.component, CLEARED_BY[f.code][1]) in healthy
                and f.observed_at.timestamp() < run_started_at
            ]
            for k in gone:
                del self.findings[k]
            if gone:
                self._save()
        return len(gone)

    def clear_component(self, component: str, before: float) -> int:
        """Drop the event findings of one component (`gpu3`) observed before `before` (a wall
        clock time): a reset of that GPU ended them."""
        with self._lock:
            gone = [
                k
                for k, f in self.findings.items()
                if f.component == component and f.observed_at.timestamp() < before
            ]
            for k in gone:
                del self.findings[k]
            if gone:
                self._save()
        return len(gone)
