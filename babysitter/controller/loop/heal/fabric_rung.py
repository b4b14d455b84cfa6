"""The `restart_fabric` rung: before a reboot, a node whose NVLink fabric is not trained, or
whose Fabric Manager or IMEX service is down, gets the service restarted by its own agent
(babysitter/agent/fabric_restart.py), never by the controller over ssh.

The order travels like a GPU reset's: an open ledger row in phase `resetting` whose evidence
says `order = fabric.restart` is handed to the node's agent in the answer to its next report
(controller/api/orders.py); the agent answers in its report metrics (`fabric_restart`). Done:
the node's validation runs as after any rung; refused or failed, or no answer within
`[remediation] reset_timeout_s`: the next rung (a reboot). The same limits as every rung: the
admission step (ownership, maintenance), the lemon count, the ledger and the audit log.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from babysitter.controller.db.actions import ActionKind
from babysitter.controller.db.store import Store
from babysitter.controller.loop.admit.admission import Act, Admission
from babysitter.controller.loop.admit.order_permission import issue
from babysitter.controller.loop.heal import after_rung
from babysitter.controller.loop.read.ledger import Ledger, Remediation
from babysitter.hardware.recovery import RecoveryAction

ORDER = "fabric.restart"  # the agent's babysitter/agent/fabric_restart.py ORDER
METRIC = "fabric_restart"  # its answer, in the agent's report metrics
FABRIC_MANAGER = "nvidia-fabricmanager"
IMEX = "nvidia-imex"

Record = Callable[[ActionKind, str, str, str, int], None]


# the driver's recovery action "recover IMEX domain" (hardware/recovery.py) is an IMEX fault
IMEX_RECOVERY = RecoveryAction.RECOVER_IMEX_DOMAIN.code


def units_for(fault_class: str) -> list[str]:
    """The services a fault class's restart covers: IMEX for an IMEX fault (`imex.*`, the
    driver's `recovery.recover_imex_domain`), else Fabric Manager (an untrained fabric, a
    training error, the service down)."""
    imex = fault_class.startswith("imex.") or fault_class == IMEX_RECOVERY
    return [IMEX] if imex else [FABRIC_MANAGER]


class FabricRung:
    def __init__(self, ledger: Ledger, store: Store, record: Record, timeout_s: float) -> None:
        self.ledger = ledger
        self.store = store
        self.record = record
        self.timeout_s = timeout_s

    def order(self, rem: Remediation, now: datetime, admission: Admission | None) -> None:
        """Order the restart from the node's agent (held by the admission step: asked again
        next tick)."""
        units = units_for(rem.fault_class)
        what = f"restart of {', '.join(units)} ordered from the node's agent"
        act, ttl = Act.RESTART_FABRIC, self.timeout_s  # bound to an expiry (order_permission.py)
        if issue(admission, self.ledger, rem, act, now, ttl, what, order=ORDER, units=units):
            return
        self.record(
            ActionKind.RESTART_FABRIC,
            rem.node,
            f"restart_fabric: {rem.fault}",
            f"ordered from the agent ({', '.join(units)})",
            rem.id,
        )

    def answer(self, rem: Remediation, now: datetime) -> tuple[bool, str] | None:
        """(True, message) once the agent restarted the services, (False, why) when it refused,
        failed or did not answer in time; None while the order is out."""
        ev = rem.evidence
        if "restart_done_at" in ev:  # done before; its validation was held
            return True, str(rem.outcome)
        row = self.store.node(rem.node) or {}
        got = (row.get("metrics") or {}).get(METRIC)
        if isinstance(got, dict) and got.get("order") == ev.get("order_id"):
            message = str(got.get("message") or "")[:300]
            if not got.get("ok"):
                # a refused restart never ran: no remediation for the lemon count
                rem.evidence["refused"] = bool(got.get("refused"))
                return False, f"agent: {message}"
            done = {"restart_done_at": now.isoformat(), **after_rung.mark(self.store, rem.node)}
            self.ledger.move(rem, rem.state, now, message, **done)
            self.record(
                ActionKind.RESTART_FABRIC, rem.node, f"restart_fabric: {rem.fault}", message, rem.id
            )
            return True, message
        issued = datetime.fromisoformat(ev["issued_at"])
        if (now - issued).total_seconds() > self.timeout_s:
            return False, f"the agent did not answer the restart order in {self.timeout_s:g} s"
        return None
