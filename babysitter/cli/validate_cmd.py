"""`babysitter validate`: the active test a node passes before it returns to service (run by the
controller as a Slurm job inside a maintenance reservation, or by an admin by hand).

1. The SDC matmul test on every device, checked with ABFT and across devices. Every GPU the
   node should have (`--gpus`, which the controller's job sets from the node's Slurm gres; else
   the hardware profile; else what NVML lists) must be tested: NVML failing to start (driver
   not loaded after a reboot), fewer GPUs than expected, or a backend that tested fewer GPUs
   (numpy, torch on the CPU) fails. Only a node with no GPUs (`--gpus 0` with a working NVML,
   or no NVML library and nothing saying it has GPUs) passes on the CPU.
2. A sustained matmul for `validation.stress_s`, watching NVML while it runs: a double-bit ECC
   error or a hardware slowdown / thermal / power-brake throttle during the stress fails, and
   so does an NVML error reading them (the watch stopped; named in the failures).
3. NCCL (`validation.nccl_command`, e.g. all_reduce_perf) when configured; its average bus
   bandwidth must reach `validation.min_busbw_gbps`.
4. Where DCGM is installed (`validation.dcgmi` found), `dcgmi diag -r LEVEL -j` (the
   level the controller's job passes for the fault, `--dcgm-level`; by hand `dcgm_other`):
   a failed test fails, and so does no readable result (checks/dcgm/diag.py). Without DCGM the
   verdict says "matmul (no DCGM)".

Prints one JSON line (`--json`) the controller reads back: {"ok", "failures", "backend",
"library", "devices", "gpus_tested", "gpus_expected", "gflops", "validation" (what ran),
"dcgm" (level, ok, per-test results), ...}; exit 0 pass, 1 fail.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from typing import Any

import click

from babysitter.checks.dcgm import diag as dcgm
from babysitter.checks.sdc.expected import GPUS_ENV  # how the controller's job passes its gres
from babysitter.cli.common import State, pass_state
from babysitter.cli.sdc_cmd import parse_inject
from babysitter.config import ValidationConfig

# nvmlClocksThrottleReasons that mean the hardware itself is in trouble (not the workload)
HW_THROTTLE = {
    0x8: "hardware slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
}
BUSBW = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.]+)")


class _Nvml:
    """What the stress watches, and every NVML error on the way, by name: an error is a failed
    validation, never "no GPU here" (an unsupported call on a board is only no data)."""

    def __init__(self) -> None:
        from babysitter.checks import nvml

        self.nvml = nvml
        self.handles: list[Any] = []
        self.init_error: str | None = None  # NVML did not start (the message)
        self.no_library = False  # ... because this node has no NVML at all
        self.errors: list[str] = []  # NVML errors during the run, first of each kind
        try:
            ok, lost = nvml.devices()
        except nvml.NvmlUnavailable as exc:
            self.init_error = str(exc)
            self.no_library = exc.code == nvml.nv.NVML_ERROR_LIBRARY_NOT_FOUND
            return
        except Exception as exc:  # an NVML error listing the GPUs
            self.init_error = f"NVML could not list the GPUs: {exc}"
            return
        self.handles = [d.handle for d in ok]
        self.errors += [f"GPU {d.index}: lost ({d.error})" for d in lost]

    def _read(self, what: str, i: int, fn: Any, *args: Any) -> Any:
        try:
            v = self.nvml.call(fn, *args)
        except Exception as exc:
            err = f"GPU {i}: NVML error reading {what} during stress: {exc}"
            if err not in self.errors:
                self.errors.append(err)
            return None
        return None if v is self.nvml.NOT_SUPPORTED else v

    def dbe(self) -> list[int | None]:
        nv = self.nvml.nv
        return [
            None
            if (
                v := self._read(
                    "ECC errors",
                    i,
                    nv.nvmlDeviceGetTotalEccErrors,
                    h,
                    nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nv.NVML_VOLATILE_ECC,
                )
            )
            is None
            else int(v)
            for i, h in enumerate(self.handles)
        ]

    def throttles(self) -> list[int]:
        nv = self.nvml.nv
        return [
            int(
                self._read("throttle reasons", i, nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
                or 0
            )
            for i, h in enumerate(self.handles)
        ]


def expected_gpus(given: int | None, profile: int | None) -> int | None:
    """The GPUs this node must have tested: the most any source says (the controller passes
    the node's Slurm gres; the hardware profile / `[checks.gpu] expected_count`); None when
    nothing says."""
    known = [n for n in (given, profile) if n is not None]
    return max(known) if known else None


def gpu_failures(nv: _Nvml, expected: int | None) -> tuple[int | None, list[str]]:
    """(GPUs to test, failures before any test): NVML must start and list them all. NVML
    failing to start where its library is there (`Driver Not Loaded` after a reboot) always
    fails, even with `--gpus 0`: only a node with no NVML library at all, and nothing saying
    it has GPUs (or an explicit `--gpus 0`), is tested on the CPU alone. The count is None
    where nothing tells it (NVML failed and no expectation): a failure."""
    if nv.init_error is not None:
        if nv.no_library and not expected:
            return 0, []  # a CPU-only machine: nothing to test but the CPU
        return expected, [f"NVML: {nv.init_error} (the node's GPUs cannot be validated)"]
    if expected == 0:
        return 0, []  # the admin's explicit statement (NVML's watch still runs)
    want = len(nv.handles) if expected is None else expected
    if len(nv.handles) < want:
        return want, [f"NVML shows {len(nv.handles)} usable GPU(s), the node has {want}"]
    return want, []


def _nccl(command: list[str], min_busbw: float, timeout_s: float) -> tuple[float | None, str]:
    try:
        r = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"NCCL test did not run: {exc}"
    m = BUSBW.search(r.stdout)
    if r.returncode != 0 or not m:
        return None, f"NCCL test failed (exit {r.returncode})"
    bw = float(m.group(1))
    if bw < min_busbw:
        return bw, f"NCCL bus bandwidth {bw:.1f} GB/s < {min_busbw:.1f}"
    return bw, ""


def _watched(nvml: _Nvml, dbe_before: list[int | None], throttled: set[str]) -> list[str]:
    """What the NVML watch saw during the stress, and the NVML errors that stopped it (what
    it did not see is not a pass)."""
    out = []
    for i, (before, after) in enumerate(zip(dbe_before, nvml.dbe(), strict=False)):
        if before is not None and after is not None and after > before:
            out.append(f"GPU {i}: {after - before} double-bit ECC error(s) during stress")
    return out + [f"{name} during stress" for name in sorted(throttled)] + nvml.errors


def _untested(tested: dict[str, Any], want: int | None) -> list[str]:
    gpus_tested = len(tested.get("gpus_tested", []))
    if want and tested["library"] and gpus_tested < want:
        return [
            f"{tested['library']} tested {gpus_tested} of the node's {want} GPU(s) "
            "(a CPU run does not validate GPUs)"
        ]
    return []


def dcgm_diag(val: ValidationConfig, level: int | None) -> tuple[str, dict[str, Any] | None]:
    """(what validated, the DCGM result) for this node: DCGM's diag at `level` (None: the
    config's dcgm_other) where dcgmi is installed, else the matmul alone, said so."""
    level = val.dcgm_other if level is None else level
    if level <= 0:
        return "matmul (DCGM diagnostic level 0)", None
    found = dcgm.find_dcgmi(val.dcgmi)
    if found is None:
        return "matmul (no DCGM)", None
    diag = dcgm.diagnose(found, level, val.dcgm_timeout_s)
    return f"dcgmi diag -r {level} + matmul", diag.to_json()


def verdict_line(failures: list[str], tested: dict[str, Any], method: str) -> str:
    what = f"{tested['library'] or tested['backend']}: {len(tested['devices'])} device(s)"
    return ("PASS" if not failures else "FAIL: " + "; ".join(failures)) + f" ({what}) [{method}]"


@click.command("validate")
@click.option("--stress-s", type=float, default=None, help="Sustained matmul (default: config).")
@click.option(
    "--devices",
    "replicas",
    type=click.IntRange(1, 64),
    default=3,
    help="CPU backends: this many CPU 'devices' (stand-ins for GPUs; 3 so a majority names "
    "the bad one).",
)
@click.option("--inject", default=None, metavar="DEV,I,J,BIT", help="Flip a bit (fault test).")
@click.option(
    "--gpus",
    type=click.IntRange(0, 1024),
    default=None,
    envvar=GPUS_ENV,
    help="GPUs this node must have tested (the controller passes the node's Slurm gres; "
    "default: the hardware profile, else what NVML lists). 0: a CPU-only node (NVML failing "
    "to start still fails).",
)
@click.option(
    "--dcgm-level",
    type=click.IntRange(0, 4),
    default=None,
    envvar=dcgm.LEVEL_ENV,
    help="`dcgmi diag -r` level where DCGM is installed (the controller's job passes it for "
    "the fault; default: [validation] dcgm_other). 0: none.",
)
@click.option("--json", "as_json", is_flag=True)
@pass_state
def validate(
    state: State,
    stress_s: float | None,
    replicas: int,
    inject: str | None,
    gpus: int | None,
    dcgm_level: int | None,
    as_json: bool,
) -> int:
    """Active validation of this node: SDC on every device, a stress run, NCCL if configured."""
    from babysitter.checks.base import CheckContext
    from babysitter.checks.sdc.backends import BackendUnavailable
    from babysitter.checks.sdc.runner import run_sdc

    cfg = state.config
    sdc, val = cfg.checks.sdc, cfg.validation
    inj = parse_inject(inject)
    nvml = _Nvml()
    expected = expected_gpus(gpus, CheckContext(cfg, cfg.agent.node_name).expect().gpu_count)
    want, failures = gpu_failures(nvml, expected)
    dbe_before = nvml.dbe()
    gflops: list[float] = []
    throttled: set[str] = set()
    tested: dict[str, Any] = {"backend": sdc.backend, "library": None, "devices": []}

    def one(inject_now: tuple[int, int, int, int] | None) -> None:
        res = run_sdc(
            sdc.backend,
            sdc.size,
            sdc.dtype,
            sdc.seed,
            replicas=replicas,
            inject=inject_now,
            state_dir=cfg.agent.spool_path.parent,
            check_name="validate.sdc",
        )
        if not gflops:
            gflops.extend(r.gflops for r in res.devices)
            tested["library"] = res.library
            tested["devices"] = [r.label for r in res.devices]
            tested["gpus_tested"] = [r.device for r in res.devices if r.device.startswith("gpu")]
        for f in res.findings:
            if f.severity.value != "ok":
                failures.append(f"{f.component}: {f.message}")
        for reasons in nvml.throttles():
            throttled.update(name for bit, name in HW_THROTTLE.items() if reasons & bit)

    try:
        if not failures:  # NVML not right: the GPUs cannot be watched, a run proves nothing
            one(inj)
        deadline = time.monotonic() + (val.stress_s if stress_s is None else stress_s)
        while not failures and not nvml.errors and time.monotonic() < deadline:
            one(None)
    except (BackendUnavailable, ValueError, IndexError) as exc:
        failures.append(f"SDC test could not run: {exc}")
    failures += _watched(nvml, dbe_before, throttled)
    failures += _untested(tested, want)
    method, diag = dcgm_diag(val, dcgm_level)
    failures += diag["failures"] if diag else []
    tested["gpus_expected"] = want
    busbw = None
    if val.nccl_command:
        busbw, why = _nccl(val.nccl_command, val.min_busbw_gbps, timeout_s=600)
        if why:
            failures.append(why)
    verdict = {
        "ok": not failures,
        "node": cfg.agent.node_name or socket.gethostname(),
        **tested,
        "failures": failures,
        "gflops": [round(g, 1) for g in gflops],
        "busbw_gbps": busbw,
        "validation": method,
        "dcgm": diag,
    }
    if as_json:
        click.echo(json.dumps(verdict))
    else:
        click.echo(verdict_line(failures, tested, method))
    return 0 if not failures else 1


commands = [validate]
