"""NVIDIA XID -> what to do, as data (NVIDIA's XID catalog as mirrored by gpud; see the domain
notes). Sites override single entries with `[checks.xid] actions = {79 = "reboot", 13 = "ignore"}`.

Classes: reboot (node fault, reboot), reset_gpu (drain, reset the GPU), app (the application
must restart; not a node fault), ignore, inspect (a workflow a human follows).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from babysitter.finding import Action, Severity


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
    "reset_gpu": _r(46, 48, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158),
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
    "inspect": _r(45, 54, 74, 78, (144, 150), 154),
}

_CLASS_RESULT: dict[str, tuple[Severity, Action]] = {
    "reboot": (Severity.CRITICAL, Action.REBOOT),
    "reset_gpu": (Severity.CRITICAL, Action.RESET_GPU),
    "inspect": (Severity.WARNING, Action.INSPECT),
    "app": (Severity.INFO, Action.NONE),
    "ignore": (Severity.OK, Action.NONE),
}
CLASSES = tuple(_CLASS_RESULT)
# what `[checks.xid] actions` may map an XID to (the config validates against these)
XidClass = Literal["reboot", "reset_gpu", "inspect", "app", "ignore"]
KNOWN_XIDS: frozenset[int] = frozenset().union(*CATALOG.values())


class XidVerdict(msgspec.Struct, frozen=True):
    xid: int
    klass: str
    severity: Severity
    action: Action
    rule: str  # which rule fired: "catalog:reset_gpu" or "site override"


def classify(xid: int, overrides: dict[int, XidClass] | None = None) -> XidVerdict:
    if overrides and xid in overrides:
        k = overrides[xid]
        sev, act = _CLASS_RESULT[k]
        return XidVerdict(xid, k, sev, act, f"site override: xid {xid} -> {k}")
    for klass, xids in CATALOG.items():
        if xid in xids:
            sev, act = _CLASS_RESULT[klass]
            return XidVerdict(xid, klass, sev, act, f"catalog: xid {xid} -> {klass}")
    # unknown XIDs: a human should look, but one alone does not take the node out
    return XidVerdict(xid, "unknown", Severity.WARNING, Action.INSPECT, f"unknown xid {xid}")
