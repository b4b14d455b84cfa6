"""`gpu.recovery`: what the driver says each GPU needs (hardware/recovery.py). One batched field
read per GPU: the recovery action (r550+), else the two older reset-status fields. A driver with
none of them says so (info); a read that fails is unknown (a warning), never ok."""

from __future__ import annotations

from typing import Any

import msgspec

from babysitter.checks.gpu.check import GpuCheck
from babysitter.checks.gpu.tiers import SIGNALS
from babysitter.checks.nvml import NOT_SUPPORTED, Device, call, nv
from babysitter.finding import Action, Finding, Severity
from babysitter.hardware.recovery import (
    FIELD_DRAIN_AND_RESET_STATUS,
    FIELD_RECOVERY_ACTION,
    FIELD_RESET_STATUS,
    RecoveryAction,
    from_reset_status,
)


class RecoveryRead(msgspec.Struct, frozen=True):
    """One GPU's answer: the action (None: not read), which field gave it, and why not."""

    action: RecoveryAction | None
    source: str  # "recovery_action" | "reset_status" | "" (not read)
    error: str = ""  # why not read ("" with action None: this driver has none of the fields)


def _field_values(handle: Any, ids: list[int]) -> list[tuple[int, int]] | None:
    """(nvmlReturn, value) per field id, in one driver call; None: the driver lacks the call."""
    try:
        values = call(nv.nvmlDeviceGetFieldValues, handle, [(i, 0) for i in ids])
    except nv.NVMLError_FunctionNotFound:
        return None
    if values is NOT_SUPPORTED:
        return None
    return [(int(v.nvmlReturn), int(v.value.uiVal)) for v in values]


def read_recovery_action(handle: Any) -> RecoveryRead:
    """The driver's recovery action for one GPU. Raises NVMLError when the call itself fails
    (the caller's error boundary makes that unknown)."""
    supported = nv.NVML_ERROR_NOT_SUPPORTED
    ok = nv.NVML_SUCCESS
    new = _field_values(handle, [FIELD_RECOVERY_ACTION])
    if new is not None:
        rc, value = new[0]
        if rc == ok:
            try:
                return RecoveryRead(RecoveryAction(value), "recovery_action")
            except ValueError:
                return RecoveryRead(None, "", f"recovery action {value} is not a known value")
        if rc != supported:
            return RecoveryRead(None, "", f"NVML error {rc} reading the recovery action")
    old = _field_values(handle, [FIELD_RESET_STATUS, FIELD_DRAIN_AND_RESET_STATUS])
    if old is None or all(rc == supported for rc, _ in old):
        return RecoveryRead(None, "")  # a driver before the reset-status fields
    bad = [rc for rc, _ in old if rc not in (ok, supported)]
    if bad:
        return RecoveryRead(None, "", f"NVML error {bad[0]} reading the reset status")
    (rc_reset, reset), (rc_drain, drain) = old
    return RecoveryRead(
        from_reset_status(reset if rc_reset == ok else 0, drain if rc_drain == ok else 0),
        "reset_status",
    )


class GpuRecoveryCheck(GpuCheck):
    """Follow the driver: each GPU's recovery action becomes a finding whose recommended action
    is the ladder's rung (reset_gpu, reboot) or a drain that names the action."""

    name = "gpu.recovery"
    signals = SIGNALS["gpu.recovery"]
    interval_s = 30.0
    code_prefix = "recovery"

    def read(self, signal: str, dev: Device) -> list[Finding]:
        return recovery_findings(self, dev, read_recovery_action(dev.handle))


def recovery_findings(check: GpuCheck, dev: Device, got: RecoveryRead) -> list[Finding]:
    """The findings of one GPU's read ([] when the driver asks for nothing)."""
    if got.action is None and got.error:
        return [
            check.problem(
                dev,
                Severity.WARNING,
                "recovery.unknown",
                f"recovery action unknown: {got.error}",
                Action.INSPECT,
            )
        ]
    if got.action is None:
        return [
            check.problem(
                dev,
                Severity.INFO,
                "recovery.unsupported",
                "this driver reports no recovery action (r550+) nor reset status",
                Action.NONE,
            )
        ]
    if got.action is RecoveryAction.NONE:
        return []
    a = got.action
    return [
        check.problem(
            dev,
            a.severity,
            a.code,
            f"driver recovery action: {a.reason}",
            a.action,
            recovery_action=int(a),
            source=got.source,
        )
    ]
