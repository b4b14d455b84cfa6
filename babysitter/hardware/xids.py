"""NVIDIA XID -> what to do, as data (NVIDIA's XID catalog as mirrored by gpud; see the domain
notes). Sites override single entries with `[checks.xid] actions = {79 = "reboot", 13 = "ignore"}`.

Classes: reboot (node fault, reboot), reset_gpu (drain, reset the GPU), app (the application
must restart; not a node fault), ignore, inspect (a workflow a human follows), recovery (XID
154: the driver's recovery action decides, hardware/recovery.py).

The NVLink XIDs follow the "Resolution Bucket (Immediate Action)" column of NVIDIA's Xid catalog
(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, read 2026-11):
- 74 NVLINK_ERROR: WORKFLOW_NVLINK_ERR, "reset the GPU or reboot the node; replace if it
  recurs" -> reset_gpu (the ladder's reset -> reboot -> inspect is that workflow).
- 144-150 NVLink5 (SAW, RLW, TLW, TREX, NVLPW_CTRL, NETIR, MSE): WORKFLOW_NVLINK5_ERR, decoded
  per error; a fatal one needs the GPU reset -> reset_gpu, and a kernel-log line that says
  "Nonfatal" is inspect (a warning, no drain).
- 154 GPU recovery action changed: bucket XID_154, "use its value" -> recovery.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from babysitter.finding import Action, Severity
from babysitter.hardware.recovery import RecoveryAction, parse_xid154


def _r(*spans: tuple[int, int] | int) -> set[int]:
    out: set[int] = set()
    for s in spans:
        if isinstance(s, tuple):
            out.update(range(s[0], s[1] + 1))
        else:
            out.add(s)
    return out


CATALOG: dict[str, set[int]] = {
    "reboot": _r(79),
    "reset_gpu": _r(
        46, 48, 62, 64, 74, 95, 109, 110, 119, 120, 136, 140, 143, (144, 150), 155, 156, 158
    ),
    "app": _r(
        8,
        11,
        13,
        25,
        31,
        32,
        (39, 41),
        60,
        (68, 72),
        (75, 77),
        80,
        (82, 86),
        88,
        89,
        94,
        (96, 105),
        (126, 135),
        139,
    ),
    "ignore": _r(
        14, 37, 38, 43, 44, 63, 66, 67, 92, 93, (106, 108), 121, 137, 141, 152, 153, 157, 160, 161
    ),
    "inspect": _r(45, 54, 78),
    "recovery": _r(154),
}

_CLASS_RESULT: dict[str, tuple[Severity, Action]] = {
    "reboot": (Severity.CRITICAL, Action.REBOOT),
    "reset_gpu": (Severity.CRITICAL, Action.RESET_GPU),
    "inspect": (Severity.WARNING, Action.INSPECT),
    "app": (Severity.INFO, Action.NONE),
    "ignore": (Severity.OK, Action.NONE),
    # XID 154 whose new action is not known (an NVML event carries no text): the driver asks
    # for a recovery; drained until gpu.recovery reads which (an unknown is never ok)
    "recovery": (Severity.CRITICAL, Action.DRAIN),
}
CLASSES = tuple(_CLASS_RESULT)
# what `[checks.xid] actions` may map an XID to (the config validates against these)
# ("recovery" is XID 154's own: a site may map 154 to another class, not another XID to it)
XidClass = Literal["reboot", "reset_gpu", "inspect", "app", "ignore"]
NVLINK5_XIDS = frozenset(range(144, 151))
KNOWN_XIDS: frozenset[int] = frozenset().union(*CATALOG.values())


class XidVerdict(msgspec.Struct, frozen=True):
    xid: int
    klass: str
    severity: Severity
    action: Action
    rule: str  # which rule fired: "catalog:reset_gpu" or "site override"
    # XID 154: the recovery action its text announces (None: not known from the XID alone)
    recovery: RecoveryAction | None = None


def classify(xid: int, overrides: dict[int, XidClass] | None = None, text: str = "") -> XidVerdict:
    """The catalog's class of an XID (a site override first); `text`, the rest of its
    kernel-log line, refines the NVLink5 XIDs (a "Nonfatal" one needs no reset)."""
    if overrides and xid in overrides:
        k = overrides[xid]
        sev, act = _CLASS_RESULT[k]
        return XidVerdict(xid, k, sev, act, f"site override: xid {xid} -> {k}")
    for klass, xids in CATALOG.items():
        if xid in xids:
            if klass == "recovery":
                return _recovery_verdict(xid, text)
            if xid in NVLINK5_XIDS and "nonfatal" in text.lower():
                sev, act = _CLASS_RESULT["inspect"]
                return XidVerdict(xid, "inspect", sev, act, f"catalog: xid {xid} nonfatal")
            sev, act = _CLASS_RESULT[klass]
            return XidVerdict(xid, klass, sev, act, f"catalog: xid {xid} -> {klass}")
    # unknown XIDs: a human should look, but one alone does not take the node out
    return XidVerdict(xid, "unknown", Severity.WARNING, Action.INSPECT, f"unknown xid {xid}")


def _recovery_verdict(xid: int, text: str) -> XidVerdict:
    """XID 154: the action its text names decides (NVIDIA's bucket XID_154: use its value)."""
    action = parse_xid154(text)
    if action is None:
        sev, act = _CLASS_RESULT["recovery"]
        return XidVerdict(xid, "recovery", sev, act, f"catalog: xid {xid}, action not in its text")
    return XidVerdict(
        xid,
        "recovery",
        action.severity,
        action.action,
        f"catalog: xid {xid} -> driver recovery action {action.label}",
        action,
    )
