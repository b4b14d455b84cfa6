"""`babysitter validate`: the active test a node passes before it returns to service (run by the
controller as a Slurm job inside a maintenance reservation, or by an admin by hand).

1. The SDC matmul test on every device, checked with ABFT and across devices.
2. A sustained matmul for `validation.stress_s`, watching NVML while it runs: a double-bit ECC
   error or a hardware slowdown / thermal / power-brake throttle during the stress fails.
3. NCCL (`validation.nccl_command`, e.g. all_reduce_perf) when configured; its average bus
   bandwidth must reach `validation.min_busbw_gbps`.

Prints one JSON line (`--json`) the controller reads back: {"ok", "failures", "gflops", ...};
exit 0 pass, 1 fail.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from typing import Any

import click

from babysitter.cli.common import State, pass_state
from babysitter.cli.sdc_cmd import parse_inject

# nvmlClocksThrottleReasons that mean the hardware itself is in trouble (not the workload)
HW_THROTTLE = {
    0x8: "hardware slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
}
BUSBW = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.]+)")


class _Nvml:
    """What the stress watches; None where NVML cannot tell (no GPU, unsupported call)."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv: Any = pynvml
            self.handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
        except Exception:  # no driver here: the SDC part still runs on the CPU backend
            self.nv = None

    def dbe(self) -> list[int | None]:
        out: list[int | None] = []
        for h in self.handles:
            try:
                out.append(
                    int(
                        self.nv.nvmlDeviceGetTotalEccErrors(
                            h,
                            self.nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                            self.nv.NVML_VOLATILE_ECC,
                        )
                    )
                )
            except Exception:
                out.append(None)
        return out

    def throttles(self) -> list[int]:
        out = []
        for h in self.handles:
            try:
                out.append(int(self.nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)))
            except Exception:
                out.append(0)
        return out


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
@click.option("--json", "as_json", is_flag=True)
@pass_state
def validate(
    state: State, stress_s: float | None, replicas: int, inject: str | None, as_json: bool
) -> int:
    """Active validation of this node: SDC on every device, a stress run, NCCL if configured."""
    from babysitter.checks.sdc.backends import BackendUnavailable
    from babysitter.checks.sdc.runner import run_sdc

    cfg = state.config
    sdc, val = cfg.checks.sdc, cfg.validation
    inj = parse_inject(inject)
    failures: list[str] = []
    nvml = _Nvml()
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
        for f in res.findings:
            if f.severity.value != "ok":
                failures.append(f"{f.component}: {f.message}")
        for reasons in nvml.throttles():
            throttled.update(name for bit, name in HW_THROTTLE.items() if reasons & bit)

    try:
        one(inj)
        deadline = time.monotonic() + (val.stress_s if stress_s is None else stress_s)
        while not failures and time.monotonic() < deadline:
            one(None)
    except (BackendUnavailable, ValueError, IndexError) as exc:
        failures.append(f"SDC test could not run: {exc}")
    for i, (before, after) in enumerate(zip(dbe_before, nvml.dbe(), strict=False)):
        if before is not None and after is not None and after > before:
            failures.append(f"GPU {i}: {after - before} double-bit ECC error(s) during stress")
    failures += [f"{name} during stress" for name in sorted(throttled)]
    busbw = None
    if val.nccl_command:
        busbw, why = _nccl(val.nccl_command, val.min_busbw_gbps, timeout_s=600)
        if why:
            failures.append(why)
    if tested["library"] and str(tested["library"]).startswith("numpy") and nvml.handles:
        # an explicit numpy on a GPU node: a pass says nothing about the GPUs, and says so
        tested["note"] = f"numpy: CPU only, the node's {len(nvml.handles)} GPU(s) were not tested"
    verdict = {
        "ok": not failures,
        "node": cfg.agent.node_name or socket.gethostname(),
        **tested,
        "failures": failures,
        "gflops": [round(g, 1) for g in gflops],
        "busbw_gbps": busbw,
    }
    if as_json:
        click.echo(json.dumps(verdict))
    else:
        what = f" ({tested['library'] or tested['backend']}: {len(tested['devices'])} device(s))"
        click.echo(("PASS" if not failures else "FAIL: " + "; ".join(failures)) + what)
    return 0 if not failures else 1


commands = [validate]
