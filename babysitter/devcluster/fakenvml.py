"""Simulated GPUs: builds the fake libnvidia-ml.so.1 (C source: fakenvml.c beside this
module) and writes its state file atomically, so tests, the demo and benchmarks can inject
faults into a running agent. The agent itself never knows: it loads "libnvidia-ml.so.1" through
pynvml as usual (LD_LIBRARY_PATH=<lib dir> for a subprocess, or `preload()` in-process)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path

# Package data: `babysitter devcluster` and the demo simulate GPUs from an installed wheel too.
SOURCE = Path(str(files("babysitter.devcluster") / "fakenvml.c"))
DEFAULT_CACHE = Path(os.environ.get("BABYSITTER_FAKENVML_CACHE", "/tmp/babysitter-fakenvml"))
ENV_STATE = "FAKE_NVML_STATE"
ENV_CALLS = "FAKE_NVML_CALLS"  # where the fake writes its per-function call counts

# NVML event types (nvml.h) tests inject
EVENT_SBE = 0x1
EVENT_DBE = 0x2
EVENT_XID = 0x8
EVENT_DRAM_RETIREMENT_FAILURE = 0x800

# the fake's keys of the driver's recovery action (fakenvml.c, its recovery-action block)
RECOVERY_KEYS = ("recovery_action", "reset_status", "drain_and_reset", "recovery_rc")

# nvmlReturn_t values tests inject
NOT_SUPPORTED = 3
DRIVER_NOT_LOADED = 9
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18

# GPU fabric states (nvmlGpuFabricState_t) and NVLink state field values (nvml.h)
FABRIC_NOT_SUPPORTED = 0
FABRIC_NOT_STARTED = 1
FABRIC_IN_PROGRESS = 2
FABRIC_COMPLETED = 3
NVLINK_INACTIVE = 0
NVLINK_ACTIVE = 1
NVLINK_SLEEP = 2
NVLINK_ACTIVE_TRAFFIC_DISABLED = 3


def health_mask(
    degraded_bw: bool | None = None,
    route_recovery: bool | None = None,
    route_unhealthy: bool | None = None,
    access_timeout_recovery: bool | None = None,
) -> int:
    """A fabric health mask: each 2-bit sub-field TRUE (1) / FALSE (2), or NOT_SUPPORTED (0)
    when None (shifts 0, 2, 4, 6 as in nvml.h)."""
    mask = 0
    for shift, bit in ((0, degraded_bw), (2, route_recovery), (4, route_unhealthy)):
        if bit is not None:
            mask |= (1 if bit else 2) << shift
    if access_timeout_recovery is not None:
        mask |= (1 if access_timeout_recovery else 2) << 6
    return mask


def build(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """Compile the fake once per source version; returns the directory holding
    libnvidia-ml.so.1 (put it on LD_LIBRARY_PATH)."""
    src = SOURCE.read_bytes()
    digest = hashlib.sha256(src).hexdigest()[:16]
    out_dir = cache_dir / digest
    lib = out_dir / "libnvidia-ml.so.1"
    if lib.exists():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".build-{os.getpid()}.so"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wno-format-truncation",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            str(tmp),
            str(SOURCE),
            "-lpthread",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    tmp.replace(lib)
    return out_dir


def preload(lib_dir: Path) -> None:
    """In-process use: load the fake by absolute path before pynvml's first nvmlInit; glibc
    then satisfies pynvml's bare-name load by SONAME. One fake per process."""
    ctypes.CDLL(str(lib_dir / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)


class FakeGpus:
    """State of the simulated GPUs of one node, written atomically on every change."""

    def __init__(
        self, path: Path, count: int = 8, name: str = "NVIDIA H100 80GB HBM3", ident: int = 0
    ) -> None:
        self.path = Path(path)
        # >0: this node's boards have UUIDs and serials of their own (the library's defaults
        # are the same on every node, and the lemon ledger follows a board across nodes)
        self.ident = ident
        self.fields: dict[str, str] = {}
        self.events: list[tuple[int, int]] = []
        self._seq = 0
        self.reset(count, name)

    def reset(self, count: int = 8, name: str = "NVIDIA H100 80GB HBM3") -> FakeGpus:
        self.fields = {"count": str(count), "driver_version": "550.54.15"}
        for i in range(count):
            self.fields[f"gpu{i}.name"] = name
            if self.ident:
                self.fields[f"gpu{i}.uuid"] = f"GPU-fa6e{self.ident:04x}-0000-4000-8000-{i:012d}"
                self.fields[f"gpu{i}.serial"] = f"165{self.ident:06d}{i:04d}"
        self.events = []
        return self.write()

    def reset_gpu(self, gpu: int) -> FakeGpus:
        """What a GPU reset does to one GPU: volatile ECC counts zeroed, pending remaps and
        retirements applied, a lost or hung GPU back, its pending events gone."""
        volatile = (
            *("lost", "dbe_volatile", "sbe_volatile", "remap_pending", "retired_pending"),
            *RECOVERY_KEYS,  # the driver asks for nothing more once the GPU was reset
        )
        prefix = f"gpu{gpu}."
        for key in list(self.fields):
            rest = key[len(prefix) :] if key.startswith(prefix) else None
            if (rest is not None and (rest in volatile or rest.startswith(("err.", "delay")))) or (
                key.startswith("event.") and self.fields[key].split(",")[0] == str(gpu)
            ):
                del self.fields[key]
        return self.write()

    def set(self, gpu: int | None = None, /, **values: object) -> FakeGpus:
        """set(3, dbe_volatile=1) or set(init_error=9); None values remove the key."""
        for k, v in values.items():
            key = k if gpu is None else f"gpu{gpu}.{k}"
            if v is None:
                self.fields.pop(key, None)
            else:
                self.fields[key] = str(v)
        return self.write()

    # ---- fabric (NVSwitch / NVL72; the C side: the "fabric block" of fakenvml.c)
    def fabric(
        self,
        gpu: int,
        state: int | None = FABRIC_COMPLETED,
        status: int | None = None,
        clique: int | None = None,
        cluster: str | None = None,
        health: int | None = None,
    ) -> FakeGpus:
        """What nvmlDeviceGetGpuFabricInfo(V) says for one GPU: state (FABRIC_*; None: the
        default, NOT_SUPPORTED), status (an nvmlReturn_t), clique id, cluster UUID (32 hex
        digits, dashes allowed) and health mask (see `health_mask`)."""
        return self.set(
            gpu,
            fabric_state=state,
            fabric_status=status,
            fabric_clique=clique,
            fabric_cluster=cluster,
            fabric_health=None if health is None else hex(health),
        )

    def nvlink_state(self, gpu: int, link: int, state: int | None) -> FakeGpus:
        """One link's NVML_FI_DEV_NVLINK_GET_STATE value (NVLINK_*; None: from nvlink_down)."""
        return self.set(gpu, **{f"nvlink_state.{link}": state})

    def recovery(
        self, gpu: int, action: int | None, *, fields: int | None = None, rc: int | None = None
    ) -> FakeGpus:
        """The driver's recovery action for one GPU (NVML field 230, 0-7; None: back to none).
        fields: which fields the driver has (2 all, 1 only the older reset-status fields 226/227,
        0 none); rc: field 230 answers this NVML error (a failed read)."""
        return self.set(gpu, recovery_action=action, recovery_fields=fields, recovery_rc=rc)

    def reset_status(self, gpu: int, reset: int = 0, drain_and_reset: int = 0) -> FakeGpus:
        """The older fields (226 reset required, 227 drain and reset recommended)."""
        return self.set(gpu, reset_status=reset, drain_and_reset=drain_and_reset)

    def lose(self, gpu: int) -> FakeGpus:
        return self.set(gpu, lost=1)

    def error(self, gpu: int, function: str, code: int | None) -> FakeGpus:
        return self.set(gpu, **{f"err.{function}": code})

    def delay(self, function: str, seconds: float | None) -> FakeGpus:
        return self.set(**{f"delay.{function}": seconds})

    def hang(self, gpu: int, seconds: float | None, function: str | None = None) -> FakeGpus:
        """Every NVML call on one GPU (or only `function` on it) sleeps first: a hung GPU."""
        return self.set(gpu, **{"delay" if function is None else f"delay.{function}": seconds})

    def xid(self, gpu: int, xid: int) -> FakeGpus:
        """An XID event, seen by event sets registered before it."""
        return self.event(gpu, EVENT_XID, xid)

    def event(self, gpu: int, event_type: int, data: int = 0) -> FakeGpus:
        """Any NVML event (EVENT_DBE, ...), seen by event sets registered for it before it."""
        self._seq += 1
        self.events.append((gpu, data))
        self.fields[f"event.{self._seq}"] = f"{gpu},{data},{event_type:#x}"
        return self.write()

    def supported_events(self, gpu: int, mask: int | None) -> FakeGpus:
        """What nvmlDeviceGetSupportedEventTypes says for this GPU (None: the default)."""
        return self.set(gpu, event_types=None if mask is None else hex(mask))

    def contexts(self, directory: Path | None) -> FakeGpus:
        """GPU contexts of real processes: from now on a live process that holds
        `directory/nvidiaN` open (see `context_file`) is a compute process of GPU N, as a
        process with a CUDA context is on a real node (it holds /dev/nvidiaN open)."""
        if directory is not None and len(str(directory)) + 12 >= 128:  # the fake's VAL_LEN
            raise ValueError(f"context directory path too long for the fake: {directory}")
        return self.set(context_dir=directory)

    def context_file(self, gpu: int) -> Path:
        """The stand-in for /dev/nvidiaN that a process holds open while it has a context."""
        return Path(self.fields["context_dir"]) / f"nvidia{gpu}"

    def write(self) -> FakeGpus:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{k}={v}\n" for k, v in self.fields.items())
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".fakenvml-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)  # readers never see a torn file
        return self

    def env(self, lib_dir: Path, calls: Path | None = None) -> dict[str, str]:
        """Environment for a subprocess (agent, `babysitter check`) using these GPUs; with
        `calls`, the fake writes its NVML call counts there (see `read_calls`)."""
        ld = os.environ.get("LD_LIBRARY_PATH", "")
        env = {
            ENV_STATE: str(self.path),
            "LD_LIBRARY_PATH": f"{lib_dir}:{ld}" if ld else str(lib_dir),
        }
        if calls is not None:
            env[ENV_CALLS] = str(calls)
        return env


def read_calls(path: Path) -> dict[str, int]:
    """The fake's call counts per NVML function ({} before its first dump)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, n = line.partition(" ")
        if n.isdigit():
            out[name] = int(n)
    return out
