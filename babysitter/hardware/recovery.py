"""The driver's own verdict on a GPU, as data: NVML's GPU recovery action (r550+ drivers,
`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, field 230, read with `nvmlDeviceGetFieldValues`; XID 154
announces each change in the kernel log) and what babysitter does for each value.

Drivers before it answer the two older fields, now deprecated in its favour:
`NVML_FI_DEV_RESET_STATUS` (226, non-zero: a GPU reset is required) and
`NVML_FI_DEV_DRAIN_AND_RESET_STATUS` (227, non-zero: drain, then reset), the two lines of
`nvidia-smi -q`'s "GPU Reset Status". Values and names: nvml.h / nvidia-ml-py 13.x
(`NVML_GPU_RECOVERY_ACTION_*`).

Each action maps to the finding's recommended action, and so to its rung of the remediation
ladder (controller/loop/decide/ladder.py): none -> nothing; GPU reset, drain and reset, bus reset ->
`reset_gpu`; node or system reboot -> `reboot`; drain P2P -> a drain whose reason says P2P (no
rung: a human looks); recover the IMEX domain -> a drain whose reason says so, and the
`restart_fabric` rung restarts nvidia-imex where the node's profile runs it (else the ladder
goes on to `reboot`)."""

from __future__ import annotations

import re
from enum import IntEnum

from babysitter.finding import Action, Severity

FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
FIELD_RESET_STATUS = 226  # NVML_FI_DEV_RESET_STATUS (deprecated)
FIELD_DRAIN_AND_RESET_STATUS = 227  # NVML_FI_DEV_DRAIN_AND_RESET_STATUS (deprecated)


class RecoveryAction(IntEnum):
    """nvmlDeviceGpuRecoveryAction_t."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7

    @property
    def label(self) -> str:
        return _LABEL[self]

    @property
    def code(self) -> str:
        """The finding code of a GPU whose driver asks for this action."""
        return f"recovery.{self.name.lower()}"

    @property
    def severity(self) -> Severity:
        return Severity.OK if self is RecoveryAction.NONE else Severity.CRITICAL

    @property
    def action(self) -> Action:
        """What a finding recommends for it (the ladder's rung follows from this)."""
        return _ACTION[self]

    @property
    def reason(self) -> str:
        """Words for a drain reason or an alert: what the driver asks for, and what follows."""
        return _REASON[self]


_LABEL = {
    RecoveryAction.NONE: "none",
    RecoveryAction.GPU_RESET: "GPU reset",
    RecoveryAction.NODE_REBOOT: "node reboot",
    RecoveryAction.DRAIN_P2P: "drain P2P",
    RecoveryAction.DRAIN_AND_RESET: "drain and reset",
    RecoveryAction.RECOVER_IMEX_DOMAIN: "recover IMEX domain",
    RecoveryAction.BUS_RESET: "bus reset",
    RecoveryAction.SYSTEM_REBOOT: "system reboot",
}
_ACTION = {
    RecoveryAction.NONE: Action.NONE,
    RecoveryAction.GPU_RESET: Action.RESET_GPU,
    RecoveryAction.NODE_REBOOT: Action.REBOOT,
    RecoveryAction.DRAIN_P2P: Action.DRAIN,
    RecoveryAction.DRAIN_AND_RESET: Action.RESET_GPU,
    RecoveryAction.RECOVER_IMEX_DOMAIN: Action.DRAIN,
    RecoveryAction.BUS_RESET: Action.RESET_GPU,
    RecoveryAction.SYSTEM_REBOOT: Action.REBOOT,
}
_REASON = {
    RecoveryAction.NONE: "no recovery needed",
    RecoveryAction.GPU_RESET: "GPU reset required",
    RecoveryAction.NODE_REBOOT: "node reboot required",
    RecoveryAction.DRAIN_P2P: (
        "drain P2P: peer-to-peer (NVLink/PCIe P2P) traffic must stop; drained for a human"
    ),
    RecoveryAction.DRAIN_AND_RESET: "drain and reset required",
    RecoveryAction.RECOVER_IMEX_DOMAIN: (
        "recover IMEX domain: the IMEX daemon's domain must be recovered (nvidia-imex restart)"
    ),
    RecoveryAction.BUS_RESET: "bus reset required",
    RecoveryAction.SYSTEM_REBOOT: "system reboot required",
}


def from_reset_status(reset_required: int, drain_and_reset: int) -> RecoveryAction:
    """The action the two older fields (226, 227) stand for."""
    if drain_and_reset:
        return RecoveryAction.DRAIN_AND_RESET
    if reset_required:
        return RecoveryAction.GPU_RESET
    return RecoveryAction.NONE


# XID 154's kernel-log text (r550+): "GPU recovery action changed from 0x0 (None) to 0x2 (Node
# Reboot Required)"; older drivers print only the new value. The number is the enum above; the
# words in parentheses vary by driver and platform ("GPU Reset Required", "PF FLR"), so the
# number decides. Bounded digits: a longer number is not a recovery action.
_XID154_RE = re.compile(
    r"recovery action changed"
    r"(?: from 0x[0-9A-Fa-f]{1,8}(?: \([^)]{0,64}\))?)?"
    r" to 0x([0-9A-Fa-f]{1,8})"
)


def parse_xid154(text: str) -> RecoveryAction | None:
    """The new action an XID 154 line announces; None when the text does not say (or names a
    value this table does not know: unknown, never a guess)."""
    m = _XID154_RE.search(text)
    if not m:
        return None
    try:
        return RecoveryAction(int(m.group(1), 16))
    except ValueError:
        return None
