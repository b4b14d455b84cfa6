"""Is any GPU of this node in use? Asked right before the SDC test takes the GPUs, after the
controller's Slurm hold made sure no job can start here: the hold covers what Slurm will do,
this covers what is already there (a job's straggling process, something outside Slurm).

Fail closed: every way of not knowing (NVML not starting on a node that has GPUs, a lost GPU,
an error or NOT_SUPPORTED from the process query) is `unknown`, and the caller skips the test
and says why. Only a node with no NVML library and no /dev/nvidia* device at all is a CPU node
with nothing to protect."""

from __future__ import annotations

import glob

import msgspec

from babysitter.checks import nvml

# GPU device files the NVIDIA driver creates (the numbered ones: one per GPU)
DEVICE_GLOB = "/dev/nvidia[0-9]*"


class Occupancy(msgspec.Struct, frozen=True):
    gpus: int = 0  # GPUs NVML sees (0 on a CPU node)
    busy: tuple[int, ...] = ()  # indexes of GPUs running compute processes
    unknown: str = ""  # why the busy state cannot be told ("" when it can)
    processes: dict[int, int] = msgspec.field(default_factory=dict)  # GPU index -> process count

    @property
    def free(self) -> bool:
        return not self.busy and not self.unknown

    def why_not(self) -> str:
        """Why the test must not run now ("" when it may)."""
        if self.unknown:
            return f"GPU busy state unknown ({self.unknown}): not taking the GPUs"
        if self.busy:
            return f"GPUs {list(self.busy)} have compute processes (a job is using them)"
        return ""


def occupancy(device_glob: str = DEVICE_GLOB) -> Occupancy:

    try:
        devs, lost = nvml.devices()
    except nvml.NvmlUnavailable as exc:
        no_library = exc.code in (None, nvml.nv.NVML_ERROR_LIBRARY_NOT_FOUND)
        if no_library and not glob.glob(device_glob):
            return Occupancy()  # no library, no device: a CPU node
        return Occupancy(unknown=str(exc))
    except nvml.nv.NVMLError as exc:
        return Occupancy(unknown=f"NVML: {exc}")
    if lost:
        return Occupancy(
            len(devs) + len(lost), unknown=f"GPU {lost[0].index} not reachable: {lost[0].error}"
        )
    busy: list[int] = []
    procs: dict[int, int] = {}
    for d in devs:
        try:
            running = nvml.call(nvml.nv.nvmlDeviceGetComputeRunningProcesses, d.handle)
        except nvml.nv.NVMLError as exc:
            return Occupancy(len(devs), tuple(busy), f"GPU {d.index} process query: {exc}", procs)
        if running is nvml.NOT_SUPPORTED:
            return Occupancy(
                len(devs), tuple(busy), f"GPU {d.index} cannot list its processes", procs
            )
        if running:
            busy.append(d.index)
            procs[d.index] = len(running)
    return Occupancy(len(devs), tuple(busy), "", procs)
