"""The finding of one XID, whichever source saw it (the kernel log, an NVML event)."""

from __future__ import annotations

from typing import Any

import msgspec

from babysitter.finding import Finding
from babysitter.hardware.recovery import RecoveryAction
from babysitter.hardware.xids import XidClass, classify


def xid_finding(
    check: str,
    xid: int,
    overrides: dict[int, XidClass],
    component: str,
    where: str,
    extra: str = "",
    recovery: RecoveryAction | None = None,
    **details: Any,
) -> Finding:
    """The finding of one XID. `recovery`: for XID 154 without its kernel-log text (an NVML
    event), the driver's recovery action read at once from the GPU; the text's, where there is
    one, is the action this XID announced."""
    v = classify(xid, overrides, extra)
    if v.klass == "recovery" and v.recovery is None and recovery is not None:
        v = msgspec.structs.replace(
            v,
            severity=recovery.severity,
            action=recovery.action,
            rule=f"catalog: xid {xid} -> driver recovery action {recovery.label} (read)",
            recovery=recovery,
        )
    node_fault = v.klass in ("reboot", "reset_gpu")
    if v.recovery is not None:
        what = f"driver recovery action: {v.recovery.reason}"
    elif v.klass == "recovery":
        what = "driver recovery action unknown: drained until gpu.recovery reads it"
    elif node_fault:
        what = "node fault"
    else:
        what = "not a node fault" if v.klass in ("app", "ignore") else "needs inspection"
    msg = f"XID {xid} on {where} ({v.klass}: {what})"
    if extra:
        msg += f": {extra[:300]}"
    if v.recovery is not None:
        details = {**details, "recovery_action": int(v.recovery)}
    return Finding(
        check=check,
        component=component,
        severity=v.severity,
        code=f"xid.{xid}",
        message=msg,
        action=v.action,
        details={"xid": xid, "class": v.klass, "rule": v.rule, **details},
    )
