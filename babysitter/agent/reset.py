"""The `reset_gpu` rung on the node: the controller orders a reset of one GPU in its answer to a
report (controller/api/orders.py); the agent, never the controller over ssh, runs the site's reset
command (`[agent] gpu_reset_command`, default `nvidia-smi --gpu-reset -i <bus id>`) under a
time limit, and only when NVML shows the GPU with no processes and its model is one whose
single-GPU reset is supported. Anything it cannot tell is a refusal, never a reset: the
controller then climbs to the next rung (a reboot through Slurm)."""

from __future__ import annotations

import logging
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

import pynvml

from babysitter.checks import nvml
from babysitter.config import AgentConfig
from babysitter.finding import Finding, Severity

log = logging.getLogger(__name__)

ORDER = "gpu.reset"  # the order's `check`: what the controller asks for
METRIC = "gpu_reset"  # the answer, in every later report's metrics until the next order
_BUS = re.compile(r"^(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)(?:\.([0-9a-f]))?$")


@dataclass(frozen=True)
class ResetOutcome:
    order: str
    ok: bool
    refused: bool  # not tried at all (busy, unsupported, GPU not found): nothing changed
    message: str
    gpu: int | None = None
    uuid: str = ""
    bus_id: str = ""
    started_at: float = 0.0  # wall clock; event findings of this GPU older than it are over
    duration_s: float = 0.0

    def finding(self) -> Finding:
        """The outcome as the node reports it (INFO: it is a record, not a fault)."""
        code = (
            "gpu.reset.done"
            if self.ok
            else ("gpu.reset.refused" if self.refused else "gpu.reset.failed")
        )
        return Finding(
            check=ORDER,
            component=f"gpu{self.gpu}" if self.gpu is not None else "host",
            severity=Severity.INFO,
            code=code,
            message=self.message,
            details={"order": self.order, "uuid": self.uuid, "pci_bus_id": self.bus_id},
        )

    def metric(self) -> dict[str, Any]:
        return asdict(self)


def bus_key(bus_id: str) -> tuple[int, int, int, int] | None:
    """A PCI address in any of its spellings (`0000:5d:00`, `00000000:5D:00.0`) as numbers."""
    m = _BUS.match(bus_id.strip().lower())
    if m is None:
        return None
    dom, bus, dev, fn = m.groups()
    return int(dom or "0", 16), int(bus, 16), int(dev, 16), int(fn or "0", 16)


def _processes(handle: Any) -> int:
    """Compute processes on the GPU (raises when NVML cannot tell: never read as idle)."""
    return len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))


def carry_out(cfg: AgentConfig, order: dict[str, Any]) -> ResetOutcome:
    oid = str(order.get("id", ""))[:64]
    want_uuid = str(order.get("uuid") or "")
    want_bus = bus_key(str(order.get("bus_id") or ""))

    def refuse(why: str, dev: nvml.Device | None = None) -> ResetOutcome:
        log.warning("GPU reset order %s refused: %s", oid, why)
        return ResetOutcome(
            oid,
            False,
            True,
            f"GPU reset refused: {why}",
            dev.index if dev else None,
            dev.uuid if dev else want_uuid,
            dev.pci if dev else str(order.get("bus_id") or ""),
        )

    if not want_uuid and want_bus is None:
        return refuse("the order names no GPU (no UUID, no PCI bus id)")
    try:
        found, lost = nvml.devices()
    except (pynvml.NVMLError, nvml.NvmlUnavailable) as exc:
        return refuse(f"NVML cannot list the GPUs: {exc}")
    dev = next(
        (
            d
            for d in found
            if (want_uuid and d.uuid == want_uuid)
            or (not want_uuid and want_bus is not None and bus_key(d.pci) == want_bus)
        ),
        None,
    )
    if dev is None:
        what = want_uuid or str(order.get("bus_id"))
        return refuse(f"no GPU {what} on this node ({len(lost)} lost): a reset cannot reach it")
    if not re.search(cfg.gpu_reset_models, dev.name):
        return refuse(f"{dev.name} does not support a single-GPU reset (gpu_reset_models)", dev)
    try:
        busy = _processes(dev.handle)
    except pynvml.NVMLError as exc:
        return refuse(f"NVML cannot list the processes on GPU {dev.index}: {exc}", dev)
    if busy:
        return refuse(f"{busy} process(es) still on GPU {dev.index}", dev)
    argv = [a.format(bus_id=dev.pci, uuid=dev.uuid, index=dev.index) for a in cfg.gpu_reset_command]
    started, t0 = time.time(), time.monotonic()
    log.warning("GPU reset order %s: running %s", oid, argv)

    def done(ok: bool, message: str) -> ResetOutcome:
        took = round(time.monotonic() - t0, 3)
        return ResetOutcome(oid, ok, False, message, dev.index, dev.uuid, dev.pci, started, took)

    try:
        r = subprocess.run(
            argv, capture_output=True, text=True, timeout=cfg.gpu_reset_timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return done(
            False, f"GPU reset of GPU {dev.index} timed out after {cfg.gpu_reset_timeout_s:g} s"
        )
    except OSError as exc:
        return done(False, f"cannot run the GPU reset command {argv[0]}: {exc.strerror}")
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
        return done(
            False, f"GPU reset of GPU {dev.index} failed (exit {r.returncode}): {tail[0][:200]}"
        )
    return done(True, f"GPU {dev.index} ({dev.uuid}, {dev.pci}) reset")
