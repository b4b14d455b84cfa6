"""What a fabric reading means: pure functions, one per signal, from what the driver or a
command said to verdicts. No I/O here (check.py reads; tests feed these directly).

Verdicts (docs/checks.md, "gpu.fabric"):
- fabric state NOT_SUPPORTED: the GPU is in no NVSwitch fabric: nothing; except on a
  configured profile with a fabric and no Fabric Manager on the node (an NVL72 tray), where
  the state is the only fabric evidence: unknown (warning), never nothing.
- NOT_STARTED / IN_PROGRESS: info while within the grace (Fabric Manager trains the fabric
  for about a minute after boot or a restart), critical past it: no multi-GPU job can run.
- COMPLETED with a status other than SUCCESS: training failed: critical.
- health mask (V struct, r550+): route unhealthy or an incorrect configuration: critical
  (NVLink traffic cannot reach its peers); degraded bandwidth, route recovery or access-timeout
  recovery in progress: warning (jobs run, slower, and the fabric may recover by itself).
  A sub-field the driver does not support (0) says nothing.
- health summary (v3 struct, r570+; nvidia-smi's `Health/Summary`): the driver's own rating,
  read beside the mask because it can say Unhealthy while every mask bit is clean (seen on
  GB200 with Status Success). Unhealthy: critical; Limited Capacity: warning; Healthy or not
  supported: nothing of its own; any other value: unknown (warning), never healthy.
- a service (`systemctl is-active`): active is ok; activating/reloading is a warning (it is
  starting); inactive/failed/deactivating is critical; anything else, or systemctl failing, is
  unknown: a warning, never ok.
- the IMEX domain (`nvidia-imex-ctl -N -j`, top-level "status"; a text answer's
  `Domain State:` line where the tool printed text): UP ok, DEGRADED warning, DOWN critical; no
  answer or output without a status: unknown (warning).
"""

from __future__ import annotations

import json
import re

import msgspec

from babysitter.finding import Action, Severity

# nvmlGpuFabricState_t (nvml.h)
NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED = 0, 1, 2, 3
STATE_NAMES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}

# nvmlGpuFabricHealthSummary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*)
SUMMARY_NOT_SUPPORTED, SUMMARY_HEALTHY, SUMMARY_UNHEALTHY, SUMMARY_LIMITED_CAPACITY = 0, 1, 2, 3

# health mask sub-fields: (name, shift, the "true" value, severity when true, what it means)
_TRUE = 1
_MASK_BITS: tuple[tuple[str, int, Severity, str], ...] = (
    ("route_unhealthy", 4, Severity.CRITICAL, "NVLink routes unhealthy"),
    ("degraded_bw", 0, Severity.WARNING, "NVLink bandwidth degraded"),
    ("route_recovery", 2, Severity.WARNING, "NVLink route recovery in progress"),
    ("access_timeout_recovery", 6, Severity.WARNING, "NVLink access-timeout recovery in progress"),
)
# incorrect configuration: a 4-bit field at shift 8; 0 not supported, 1 none, 2.. a fault
_INCORRECT_CONFIG = {
    2: "incorrect system GUID",
    3: "incorrect chassis serial number",
    4: "no NVLink partition",
    5: "insufficient NVLinks",
    6: "incompatible GPU firmware",
    7: "invalid location",
    8: "invalid GPU state",
}


class Verdict(msgspec.Struct, frozen=True):
    severity: Severity
    code: str
    message: str
    action: Action = Action.NONE

    @property
    def fault(self) -> bool:
        return self.severity in (Severity.WARNING, Severity.CRITICAL)


def fabric_state(
    state: int, status: int, pending_s: float, grace_s: float, required: bool = False
) -> Verdict | None:
    """One GPU's fabric training; `pending_s`: how long it has been seen not COMPLETED (the
    smaller of the time since boot and since the check first saw it so). None: no fabric.
    `required`: the node's configured profile has a fabric and this state is its only
    evidence of it (no Fabric Manager on the node): NOT_SUPPORTED is then unknown."""
    if state == NOT_SUPPORTED and required:
        return Verdict(
            Severity.WARNING,
            "fabric.state_unknown",
            "NVLink fabric state NOT_SUPPORTED, but this node's profile has an NVSwitch fabric",
            Action.INSPECT,
        )
    if state == NOT_SUPPORTED:
        return None
    name = STATE_NAMES.get(state)
    if name is None:
        return Verdict(
            Severity.WARNING,
            "fabric.state_unknown",
            f"NVLink fabric state {state} unknown to babysitter",
            Action.INSPECT,
        )
    if state in (NOT_STARTED, IN_PROGRESS):
        if pending_s < grace_s:
            return Verdict(
                Severity.INFO,
                "fabric.training",
                f"NVLink fabric {name} for {pending_s:.0f} s (grace {grace_s:g} s)",
            )
        return Verdict(
            Severity.CRITICAL,
            "fabric.not_trained",
            f"NVLink fabric {name} for {pending_s:.0f} s (Fabric Manager down or failed?): "
            "multi-GPU jobs cannot run",
            Action.DRAIN,
        )
    if status != 0:
        return Verdict(
            Severity.CRITICAL,
            "fabric.status_error",
            f"NVLink fabric training failed (status {status})",
            Action.DRAIN,
        )
    return Verdict(Severity.OK, "fabric.ok", "NVLink fabric COMPLETED")


def health_mask(mask: int) -> list[Verdict]:
    """The faults a fabric health mask reports, worst first."""
    out: list[Verdict] = []
    bad_config = (mask >> 8) & 0xF
    if bad_config >= 2:
        what = _INCORRECT_CONFIG.get(bad_config, f"code {bad_config}")
        out.append(
            Verdict(
                Severity.CRITICAL,
                "fabric.incorrect_configuration",
                f"NVLink fabric incorrectly configured: {what}",
                Action.DRAIN,
            )
        )
    for name, shift, sev, what in _MASK_BITS:
        if (mask >> shift) & 0x3 == _TRUE:
            action = Action.DRAIN if sev is Severity.CRITICAL else Action.WATCH
            out.append(Verdict(sev, f"fabric.{name}", what, action))
    return out


def health_summary(summary: int | None) -> Verdict | None:
    """The driver's health summary (None: the driver gave none, a v1/v2 struct)."""
    if summary in (None, SUMMARY_NOT_SUPPORTED, SUMMARY_HEALTHY):
        return None  # nothing of its own: the mask's faults still count
    if summary == SUMMARY_UNHEALTHY:
        return Verdict(
            Severity.CRITICAL,
            "fabric.unhealthy",
            "NVLink fabric health summary Unhealthy",
            Action.DRAIN,
        )
    if summary == SUMMARY_LIMITED_CAPACITY:
        return Verdict(
            Severity.WARNING,
            "fabric.limited_capacity",
            "NVLink fabric health summary Limited Capacity",
            Action.WATCH,
        )
    return Verdict(
        Severity.WARNING,
        "fabric.summary_unknown",
        f"NVLink fabric health summary {summary} unknown to babysitter",
        Action.INSPECT,
    )


def gpu_fabric(
    state: int,
    status: int,
    mask: int,
    summary: int | None,
    pending_s: float,
    grace_s: float,
    required: bool = False,
) -> list[Verdict]:
    """Everything one GPU's fabric info says, worst first; [] where it has no fabric. A trained
    fabric adds its health summary's and health mask's faults to the training verdict."""
    verdict = fabric_state(state, status, pending_s, grace_s, required)
    if verdict is None:
        return []
    if state != COMPLETED:
        return [verdict]
    rated = health_summary(summary)
    faults = ([rated] if rated else []) + health_mask(mask)
    if not faults:
        return [verdict]
    return faults if verdict.severity is Severity.OK else [verdict, *faults]


_UP = {"active"}
_STARTING = {"activating", "reloading", "refreshing"}
_DOWN = {"inactive", "failed", "deactivating"}


def service(unit: str, output: str | None, code: str) -> Verdict:
    """`systemctl is-active <unit>`'s answer (None: systemctl could not be asked)."""
    state = (output or "").strip().splitlines()[0].strip() if (output or "").strip() else ""
    if output is None or not state:
        return Verdict(
            Severity.WARNING,
            f"{code}.unknown",
            f"{unit}: state unknown (systemctl gave no answer)",
            Action.WATCH,
        )
    if state in _UP:
        return Verdict(Severity.OK, f"{code}.active", f"{unit} active")
    if state in _STARTING:
        return Verdict(Severity.WARNING, f"{code}.starting", f"{unit} {state}", Action.WATCH)
    if state in _DOWN:
        return Verdict(
            Severity.CRITICAL,
            f"{code}.down",
            f"{unit} {state}: the NVLink fabric it serves is down",
            Action.DRAIN,
        )
    return Verdict(
        Severity.WARNING, f"{code}.unknown", f"{unit}: state {state!r} unknown", Action.WATCH
    )


_DOMAIN_STATE = re.compile(r"^Domain State:\s*(\S+)", re.MULTILINE)


def imex_domain(output: str | None) -> Verdict:
    """`nvidia-imex-ctl -N -j`'s top-level "status" (None: the command failed)."""
    status = None
    if output:
        try:
            doc = json.loads(output)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("status"), str):
            status = doc["status"].upper()
        elif doc is None:  # the text table (`-N` without `-j`): its `Domain State:` line
            m = _DOMAIN_STATE.search(output)
            status = m.group(1).upper() if m else None
    if status == "UP":
        return Verdict(Severity.OK, "imex.domain_up", "IMEX domain UP")
    if status == "DEGRADED":
        return Verdict(
            Severity.WARNING,
            "imex.domain_degraded",
            "IMEX domain DEGRADED: some nodes of the NVLink domain are not connected",
            Action.WATCH,
        )
    if status == "DOWN":
        return Verdict(
            Severity.CRITICAL,
            "imex.domain_down",
            "IMEX domain DOWN: multi-node NVLink jobs cannot run",
            Action.DRAIN,
        )
    why = "no answer" if not output else f"status {status!r}" if status else "unparsable output"
    return Verdict(
        Severity.WARNING, "imex.domain_unknown", f"IMEX domain status unknown ({why})", Action.WATCH
    )


def cluster_uuid(raw: bytes) -> str | None:
    """The fabric's cluster UUID as text (None when the driver leaves it zero)."""
    if not any(raw):
        return None
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
