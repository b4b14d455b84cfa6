"""What every step of the healer's state machine (states.py) reads and writes: the settings
the engine reloads (controller/loop/reconfigure.py sets them on the Healer), the ledger,
Slurm through the admission door, this tick's open episodes, and the record of each action.
The Healer (healer.py) is this plus the dispatch; the transitions take it as `h`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

from babysitter.controller.db import audit
from babysitter.controller.db.actions import Action as Recorded
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.tickstore import record_rows
from babysitter.controller.loop.admit.admission import Admission
from babysitter.controller.loop.admit.gate import AdmittedSlurm
from babysitter.controller.loop.decide.ladder import LadderTable
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.heal.fabric_rung import FabricRung
from babysitter.controller.loop.heal.lemons import DrainLemon
from babysitter.controller.loop.heal.validation import Validator
from babysitter.controller.loop.read.context import LoopContext
from babysitter.controller.loop.read.ledger import Ledger, Remediation
from babysitter.controller.loop.record.alerts import Alert
from babysitter.slurm.client import SlurmError, SlurmNode
from babysitter.slurm.ownership import automatic_reason

# one logger for every step of the healer, named as before its split into modules (a site
# filtering its log on it keeps seeing them all)
log = logging.getLogger("babysitter.controller.loop.heal.healer")

REBOOT_FLAGS = frozenset({"REBOOT", "REBOOT_REQUESTED", "REBOOT_ISSUED"})
CONFIG_TTL_S = 60.0  # slurm.conf's RebootProgram is re-read at most this often
DONE = ActionStatus.DONE
LEMON_CONDITION = "lemon_node"  # the policy's own lemon alert is replaced by the ledger's


@dataclass(frozen=True)
class Tick:
    """One step of the loop: its time, and the alerts it fires and clears."""

    now: datetime
    firing: list[Alert]
    clearing: list[tuple[str | None, str]]


class HealerBase:
    admission: Admission | None = None  # asked before a reboot or reset (set by the engine)

    @property
    def admitted(self) -> AdmittedSlurm:
        """Its Slurm changes, each node change admitted first (controller/loop/admit/gate.py)."""
        return AdmittedSlurm(self.slurm, self.admission)

    def __init__(self, ctx: LoopContext, validator: Validator, dry_run: bool) -> None:
        cfg, store, slurm, snapshot = ctx.cfg, ctx.store, ctx.slurm, ctx.snapshot
        self.cfg = cfg.remediation
        self.prefix = cfg.slurm.reason_prefix
        self.validation_minutes = cfg.validation.time_limit_min + 5
        self.validation_user = cfg.validation.user
        self.heartbeat_s = cfg.controller.heartbeat_timeout_s  # after_rung.py's bound
        self.enabled = cfg.remediation.enabled
        self.store = store
        self.slurm = slurm
        self.snapshot = snapshot
        self.validator = validator
        self.dry_run = dry_run
        self.ladder = LadderTable.from_config(cfg.remediation)
        self.lemon_drains = (cfg.policy.lemon_drains, cfg.policy.lemon_window_days)
        # this tick's drained nodes the policy calls lemons and no rung addresses
        self._drain_lemons: dict[str, DrainLemon] = {}
        self.ledger = Ledger(store)
        # the restart_fabric rung's order and answer (controller/loop/heal/fabric_rung.py)
        self.fabric_rung = FabricRung(self.ledger, store, self.record, self.cfg.reset_timeout_s)
        self._program: tuple[float, str] | None = None
        self.open: dict[str, Remediation] = {}  # node -> its open episode (this tick)
        self._dry_drains: set[str] = set()  # dry-run drains of this tick: Slurm shows none
        # nodes in an open maintenance window (set by the engine each tick): an admin is on
        # them, so no rung starts or is issued there until the window ends
        self.quiet: set[str] = set()
        self.maintenance_known = True  # False: the windows could not be read this tick

    def ours(self, sn: SlurmNode | None) -> bool:
        """Drained by babysitter's policy: not an admin's drain, not the HealthCheckProgram's."""
        return sn is not None and automatic_reason(sn.reason, self.prefix)

    def in_service(self, node: str) -> bool:
        """Slurm shows the node neither drained, draining nor down (this tick's snapshot)."""
        sn = self.snapshot.nodes.get(node)
        return sn is not None and not (sn.drained_or_draining or sn.down)

    def reboot_program(self) -> str:
        """slurm.conf's RebootProgram, read at most every CONFIG_TTL_S."""
        if self._program is None or time.monotonic() - self._program[0] > CONFIG_TTL_S:
            try:
                self._program = (time.monotonic(), self.slurm.reboot_program())
            except SlurmError as exc:
                log.warning("cannot read RebootProgram: %s", exc)
                return self._program[1] if self._program else ""
        return self._program[1]

    def record(
        self,
        kind: ActionKind,
        node: str,
        reason: str,
        outcome: str,
        rid: int,
        status: ActionStatus = ActionStatus.DONE,
    ) -> None:
        """Every healer action in the actions log and the audit log too (who, why, on what
        evidence, what became of it)."""
        self.record_many([(kind, node, reason, outcome, rid)], status)

    def record_many(
        self, records: list[tuple[ActionKind, str, str, str, int]], status: ActionStatus = DONE
    ) -> None:
        """`record` for several (kind, node, reason, outcome, ledger row): one statement."""
        rows = record_rows(
            self.store,
            [
                Recorded(
                    kind=kind,
                    node=node,
                    reason=reason[:1000],
                    rule=Rule.REMEDIATION,
                    requested_by="policy",
                    status=status,
                    outcome=f"{outcome} (ledger row {rid})"[:1000],
                )
                for kind, node, reason, outcome, rid in records
            ],
        )
        audit.record_rows(self.store, rows)
