"""The remediation ladder, as data: for each fault class, the rungs babysitter climbs in order.

A fault class is a finding's code (`gpu.lost`, `row_remap.pending`) or `xid.<N>` for an XID.
The defaults come from the XID catalog (hardware/xids.py: reboot-class XIDs start at `reboot`,
reset-class ones at `reset_gpu`) and from what each GPU check recommends; a site overrides
single entries with `[remediation] ladder = {"xid.79" = ["reboot", "rma"]}`. A fault class not
in the table climbs by its finding's recommended action. A ladder always ends in a rung that
leaves the node drained for a human (`inspect` or `rma`): a failed remediation escalates, it
never loops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import get_args

from babysitter.config import RemediationConfig, RungName
from babysitter.finding import Action, Finding, Severity, job_owned
from babysitter.hardware.recovery import RecoveryAction
from babysitter.hardware.xids import CATALOG


class Rung(StrEnum):
    RESET_GPU = "reset_gpu"  # the agent resets one idle GPU (the site's command)
    # the agent restarts nvidia-fabricmanager / nvidia-imex (controller/loop/heal/fabric_rung.py)
    RESTART_FABRIC = "restart_fabric"
    REBOOT = "reboot"  # `scontrol reboot ASAP`: Slurm drains, runs RebootProgram, sees the boot
    INSPECT = "inspect"  # stays drained, pages: a human looks
    RMA = "rma"  # stays drained, pages: the hardware goes back

    @property
    def automatic(self) -> bool:
        """A rung babysitter carries out itself (the others wait for a human)."""
        return self in (Rung.RESET_GPU, Rung.RESTART_FABRIC, Rung.REBOOT)


if {r.value for r in Rung} != set(get_args(RungName)):
    raise AssertionError("Rung must have exactly the config's RungName values")

Ladder = tuple[Rung, ...]

_RESET: Ladder = (Rung.RESET_GPU, Rung.REBOOT, Rung.INSPECT)
_REBOOT: Ladder = (Rung.REBOOT, Rung.INSPECT)
_INSPECT: Ladder = (Rung.INSPECT,)
# an untrained NVLink fabric, Fabric Manager or IMEX down: restart the service, then reboot
_FABRIC: Ladder = (Rung.RESTART_FABRIC, Rung.REBOOT, Rung.INSPECT)
# gpu.fabric's findings a service restart can heal (checks/fabric/judge.py)
FABRIC_RESTART: frozenset[str] = frozenset(
    {
        "fabric.not_trained",
        "fabric.status_error",
        "fabric_manager.down",
        "imex.down",
        "imex.domain_down",
        # the driver's recovery action "recover IMEX domain" (hardware/recovery.py)
        RecoveryAction.RECOVER_IMEX_DOMAIN.code,
    }
)

# By the action a finding recommends, for a fault class the table does not name.
BY_ACTION: dict[Action, Ladder] = {
    Action.RESET_GPU: _RESET,
    Action.REBOOT: _REBOOT,
    Action.INSPECT: _INSPECT,
}


def _defaults() -> dict[str, Ladder]:
    table: dict[str, Ladder] = {}
    for xid in CATALOG["reboot"]:
        table[f"xid.{xid}"] = _REBOOT
    for xid in CATALOG["reset_gpu"]:
        table[f"xid.{xid}"] = _RESET
    for xid in CATALOG["inspect"]:
        table[f"xid.{xid}"] = _INSPECT
    # the driver's recovery action (hardware/recovery.py): GPU reset, drain and reset, bus
    # reset start at reset_gpu; node and system reboot at reboot; recover IMEX domain at
    # restart_fabric (FABRIC_RESTART, below). Drain P2P recommends a drain (no rung: the node
    # stays drained for a human, its reason says so); XID 154 (its class "recovery") climbs by
    # the action its text or the field gave.
    for a in RecoveryAction:
        if a.action in BY_ACTION:
            table[a.code] = BY_ACTION[a.action]
    table.update(
        {
            # NVML: GPU lost / fallen off the bus: only a power cycle brings it back
            "gpu.lost": _REBOOT,
            "gpu.unavailable": _REBOOT,
            "gpu.count": _REBOOT,
            # memory faults a reset clears (Azure HPC health checks: pending remaps need a
            # reset or reboot; a failed remap needs the hardware replaced)
            "ecc.dbe.volatile": _RESET,
            "ecc.dbe.event": _RESET,
            "row_remap.pending": _RESET,
            "retired_pages.pending": _RESET,
            "row_remap.failed": (Rung.RMA,),
        }
    )
    table.update(dict.fromkeys(FABRIC_RESTART, _FABRIC))
    return table


DEFAULT_LADDER: Mapping[str, Ladder] = _defaults()


def fault_class(f: Finding) -> str:
    """The ladder's key of a finding."""
    return f.code


def remediable(f: Finding) -> bool:
    """A node-level finding whose fault a rung can address (critical, reset or reboot, or a
    critical fabric finding a service restart can heal)."""
    if job_owned(f) or f.severity < Severity.WARNING:
        return False
    # the fabric findings recommend a drain; their ladder starts with a service restart
    return f.action in (Action.RESET_GPU, Action.REBOOT) or (
        f.code in FABRIC_RESTART and f.severity is Severity.CRITICAL
    )


@dataclass(frozen=True)
class LadderTable:
    table: Mapping[str, Ladder]

    @classmethod
    def from_config(cls, cfg: RemediationConfig) -> LadderTable:
        table = dict(DEFAULT_LADDER)
        for key, rungs in cfg.ladder.items():
            table[key] = tuple(Rung(r) for r in rungs)
        return cls(table)

    def rungs(self, klass: str, action: Action) -> Ladder:
        """The ladder of a fault class (by the finding's recommended action if not listed)."""
        found = self.table.get(klass) or BY_ACTION.get(action, _INSPECT)
        # an override that ends in an automatic rung still ends with a human
        return found if not found[-1].automatic else (*found, Rung.INSPECT)

    def first(self, klass: str, action: Action) -> Rung:
        return self.rungs(klass, action)[0]

    def after(self, klass: str, action: Action, rung: Rung) -> Rung:
        """The rung that follows `rung` when it failed (the last one stays the last)."""
        ladder = self.rungs(klass, action)
        if rung in ladder:
            return ladder[min(ladder.index(rung) + 1, len(ladder) - 1)]
        return ladder[-1]
