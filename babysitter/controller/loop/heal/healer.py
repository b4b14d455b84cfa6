"""Self-healing, one step per tick of the remediation loop (leader only): a node babysitter
drained for a reset- or reboot-class fault climbs the remediation ladder
(loop/decide/ladder.py), comes back, passes validation and returns to service; a failed rung
escalates to the next one; too many remediations make it a lemon that waits for an admin (the
ledger, controller/loop/read/ledger.py).

A reboot, step by step (every step recorded on the node's ledger row and in the actions log):
1. Limits first: the lemon count, a RebootProgram in slurm.conf (without one `scontrol reboot`
   never completes: the node escalates to `inspect` and the alert says why), and at most
   max(K, P x partition) nodes of a partition in reboot at once (the others wait their turn).
2. A MAINT reservation on the node (the validation's, loop/heal/validation.py), so whatever
   state Slurm returns it in after the boot (ReturnToService=2 resumes a node on its own), no
   job but the validation job starts there.
3. `scontrol reboot ASAP nextstate=DOWN reason="babysitter: reboot: <why>" NODE`: Slurm lets
   the running jobs end (never kills them), runs the site's RebootProgram, sees the boot.
4. Back = Slurm shows a new boot time without a reboot flag AND the agent reports a new boot
   id (the agent's event findings of the old boot are then gone). A fault still reported after
   the boot fails the rung at once; else the validation job runs in the reservation.
5. Validation passed: the reservation goes, the node is in service (validation.py resumes it).
   Failed: the node is drained with `validation failed: ...` and the next rung follows.
   Not back within reboot_timeout_s: paged, stays drained.

The policy must not resume a node while its episode is open (it would see the fault gone after
the boot): `hold` filters the policy's decisions for those nodes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from babysitter.controller.db import audit
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.episodes import state_of, validated_for_this_drain
from babysitter.controller.db.tickstore import policy_rows
from babysitter.controller.loop.admit.admission import Act, Admission, Refusal, Why
from babysitter.controller.loop.admit.gate import AdmittedSlurm, Held
from babysitter.controller.loop.admit.maintenance import MAINTENANCE_UNKNOWN, maintenance_unknown
from babysitter.controller.loop.admit.order_permission import expire_quiet, issue
from babysitter.controller.loop.decide.ladder import LadderTable, Rung, remediable
from babysitter.controller.loop.decide.ownership import Owner, episode_owner
from babysitter.controller.loop.decide.policy import Decision, DecisionKind, Rule
from babysitter.controller.loop.heal import after_rung
from babysitter.controller.loop.heal.fabric_rung import FabricRung
from babysitter.controller.loop.heal.lemons import DrainLemon, drain_lemons
from babysitter.controller.loop.heal.takeover import cancel_pending_reboot, end_taken_over
from babysitter.controller.loop.heal.validation import Validator, reservation_name
from babysitter.controller.loop.read.context import LoopContext
from babysitter.controller.loop.read.ledger import ACTIVE, Ledger, Phase, Remediation
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Action, Finding, Severity
from babysitter.slurm.client import SlurmError, SlurmNode, SlurmUnavailable
from babysitter.slurm.ownership import automatic_reason

log = logging.getLogger(__name__)

REBOOT_FLAGS = frozenset({"REBOOT", "REBOOT_REQUESTED", "REBOOT_ISSUED"})
CONFIG_TTL_S = 60.0  # slurm.conf's RebootProgram is re-read at most this often
RESET_METRIC = "gpu_reset"  # the agent's answer to a reset order, in its report metrics
LEMON_CONDITION = "lemon_node"  # the policy's own lemon alert is replaced by the ledger's


@dataclass(frozen=True)
class Fault:
    """The finding a rung is for, reduced to what the ledger keeps."""

    klass: str
    action: Action
    summary: str
    gpu_uuid: str | None
    gpu_serial: str | None
    bus_id: str | None

    @classmethod
    def of(cls, f: Finding) -> Fault:
        d = f.details or {}
        return cls(
            klass=f.code,
            action=f.action,
            summary=f"{f.check}: {f.message}"[:300],
            gpu_uuid=_text(d.get("uuid")),
            gpu_serial=_text(d.get("serial")),
            bus_id=_text(d.get("pci_bus_id") or d.get("pci")),
        )


def _text(v: Any) -> str | None:
    return str(v)[:96] if v else None


class Healer:
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
        self.fabric_rung = FabricRung(self.ledger, store, self._record, self.cfg.reset_timeout_s)
        self._program: tuple[float, str] | None = None
        self.open: dict[str, Remediation] = {}  # node -> its open episode (this tick)
        self._dry_drains: set[str] = set()  # dry-run drains of this tick: Slurm shows none
        # nodes in an open maintenance window (set by the engine each tick): an admin is on
        # them, so no rung starts or is issued there until the window ends
        self.quiet: set[str] = set()
        self.maintenance_known = True  # False: the windows could not be read this tick

    # ---- the policy's side
    def hold(self, decisions: list[Decision]) -> list[Decision]:
        """The policy's decisions minus those an open episode owns: no resume or validation
        (the healer validates and resumes), no drain while a reboot or validation runs, and
        the ledger's lemon instead of the policy's drain count. While the maintenance windows
        cannot be read, no drain, resume or validation at all (a window may cover any node)."""
        if not self.maintenance_known:
            moves = (DecisionKind.DRAIN, DecisionKind.RESUME, DecisionKind.VALIDATE)
            decisions = [d for d in decisions if d.kind not in moves]
        if not self.enabled:
            return decisions
        self.open = self._open_by_node()
        self._dry_drains = {
            d.node for d in decisions if d.kind is DecisionKind.DRAIN and d.dry_run and d.node
        }
        asked = {
            d.node
            for d in decisions
            if d.kind is DecisionKind.ESCALATE and d.condition == LEMON_CONDITION and d.node
        }
        limit, days = self.lemon_drains
        self._drain_lemons = drain_lemons(
            self.store,
            {n for n in asked - self.open.keys() if self._ours(self.snapshot.nodes.get(n))},
            datetime.now(UTC),
            days,
            limit,
        )
        out = []
        for d in decisions:
            if d.node in self._drain_lemons and d.kind in (
                DecisionKind.RESUME,
                DecisionKind.VALIDATE,
            ):
                continue  # a lemon now (step): stays drained for an admin
            rem = self.open.get(d.node or "")
            if rem is not None and not rem.evidence.get("hold", True):
                rem = None  # escalated only because this cluster cannot act: not held
            if rem is not None and d.kind in (DecisionKind.RESUME, DecisionKind.VALIDATE):
                continue
            if rem is not None and rem.state in ACTIVE and d.kind is DecisionKind.DRAIN:
                continue
            if d.kind is DecisionKind.ESCALATE and d.condition == LEMON_CONDITION:
                continue
            out.append(d)
        return out

    def _open_by_node(self) -> dict[str, Remediation]:
        out: dict[str, Remediation] = {}
        for r in sorted(self.ledger.open_rows(), key=lambda r: r.id):
            out[r.node] = r  # the newest open row is the node's episode
        return out

    # ---- the loop step
    def step(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        if not self.maintenance_known:
            firing.append(maintenance_unknown(now))
            self._lemon_alerts(now, firing)
            return  # a window may have opened on any node since the last read: no step
        clearing.append((None, MAINTENANCE_UNKNOWN))
        if not self.enabled or not self.snapshot.ok:
            self._lemon_alerts(now, firing)
            return
        self.open = self._open_by_node()
        unsure: set[str] = set()  # nodes whose owner cannot be read this tick: no step
        for node, rem in list(self.open.items()):
            if node in self.quiet:
                # no step while an admin is on it, but an order out does not outlive its
                # expiry there (order_permission.py): it would never time out otherwise
                if expire_quiet(self.ledger, rem, now, self.cfg.reset_timeout_s, self._record):
                    self.open.pop(node)
                continue
            if rem.state in ACTIVE:
                # at every step of an episode, not only at its start: an admin may have
                # taken the node over since the last tick
                sn = self.snapshot.nodes.get(node)
                owner = episode_owner(sn, self.prefix)
                if owner is Owner.UNKNOWN:
                    unsure.add(node)
                    continue
                if owner is Owner.OTHER and sn is not None:
                    end_taken_over(self.store, self.slurm, rem, sn, now)
                    self.open.pop(node)
                    continue
            self._advance(rem, now, firing, clearing)
        candidates = [
            n
            for n in sorted((self.snapshot.held | self._dry_drains) - self.open.keys() - self.quiet)
            if n in self._dry_drains or self._startable(self.snapshot.nodes.get(n))
        ]
        # one read for all of them: a cluster may hold many drained nodes
        for row in policy_rows(self.store, names=candidates) if candidates else []:
            self._maybe_start(row["name"], row["open_findings"], now, firing)
        for node, lemon in self._drain_lemons.items():
            if node not in self.open and node not in self.quiet and not self.dry_run:
                self._drain_lemon(node, lemon, now)
        waiting = sorted(
            (
                r
                for node, r in self.open.items()
                if r.state is Phase.WAITING and node not in self.quiet | unsure
            ),
            key=lambda r: r.id,
        )
        for rem in waiting:
            self._issue(rem, now, firing)
        self._lemon_alerts(now, firing)

    def _lemon_alerts(self, now: datetime, firing: list[Alert]) -> None:
        """Asserted every tick, a held one too: an alert not asserted is resolved (the
        engine's per-tick conditions), and a lemon is still a lemon while the loop holds."""
        for rem in self.open.values():
            if rem.state is Phase.LEMON:
                firing.append(self._lemon_alert(rem, now))

    def _ours(self, sn: SlurmNode | None) -> bool:
        """Drained by babysitter's policy: not an admin's drain, not the HealthCheckProgram's."""
        return sn is not None and automatic_reason(sn.reason, self.prefix)

    def _startable(self, sn: SlurmNode | None) -> bool:
        """Drained by the policy and not already in a reboot of Slurm's."""
        return sn is not None and self._ours(sn) and not sn.flags & REBOOT_FLAGS

    def _maybe_start(
        self, node: str, findings: list[Finding], now: datetime, firing: list[Alert]
    ) -> None:
        faults = [f for f in findings if remediable(f)]
        if not faults:
            return
        # a reboot covers a reset-class fault too: the fault with the strongest first rung
        fault = max(
            (Fault.of(f) for f in faults),
            key=lambda x: self.ladder.first(x.klass, x.action) is Rung.REBOOT,
        )
        self._climb(node, fault, self.ladder.first(fault.klass, fault.action), now, firing)

    def _climb(
        self, node: str, fault: Fault, rung: Rung, now: datetime, firing: list[Alert]
    ) -> None:
        """Put the node on `rung`, after the limits: lemon first, then whether the rung can
        run here at all."""
        common: dict[str, Any] = {
            "gpu_uuid": fault.gpu_uuid,
            "gpu_serial": fault.gpu_serial,
            "evidence": {"action": fault.action.value, "bus_id": fault.bus_id},
        }
        if rung.automatic:
            window = timedelta(days=self.cfg.lemon_window_days)
            gpus = {g for g in (fault.gpu_uuid, fault.gpu_serial) if g}
            past = self.ledger.counted(node, gpus, now - window)
            if len(past) >= self.cfg.lemon_remediations:
                common["evidence"]["history"] = [
                    {
                        "at": r.created_at.isoformat(),
                        "rung": r.rung.value,
                        "fault": r.fault_class,
                        "state": r.state.value,
                    }
                    for r in past
                ]
                days = f"{self.cfg.lemon_window_days:g} days"
                self._lemon(node, fault, f"{len(past)} remediations in {days}", now, common)
                return
            why_not = self._cannot(rung, fault)
            while why_not and rung is Rung.RESET_GPU:
                # a reset that cannot be ordered here: the next rung (a reboot) instead
                common["evidence"]["reset_skipped"] = why_not
                rung = self.ladder.after(fault.klass, fault.action, rung)
                why_not = self._cannot(rung, fault)
            if why_not:
                rung = Rung.INSPECT
                common["evidence"]["skipped"] = why_not
        if self.dry_run:
            self.ledger.add(
                node,
                rung,
                fault.klass,
                fault.summary,
                Phase.DRY_RUN,
                now,
                outcome=f"dry-run: would {rung.value}",
                **common,
            )
            return
        if not rung.automatic:
            self._hold_for_human(node, fault, rung, now, firing, common)
            return
        rid = self.ledger.add(
            node,
            rung,
            fault.klass,
            fault.summary,
            Phase.WAITING,
            now,
            outcome=f"{rung.value} decided",
            **common,
        )
        self.open[node] = self.ledger.history(node, limit=1)[0]
        log.info("%s: %s decided for %s (ledger row %s)", node, rung.value, fault.klass, rid)

    def _hold_for_human(
        self,
        node: str,
        fault: Fault,
        rung: Rung,
        now: datetime,
        firing: list[Alert],
        common: dict[str, Any],
    ) -> None:
        """A rung no automation runs (inspect, rma, or one this cluster cannot run): the
        node stays drained for an admin, in the ledger and, for the ladder's own choice, paged."""
        skipped = common["evidence"].get("skipped")
        why = skipped or f"the {fault.klass} ladder says {rung.value}"
        # a rung this cluster cannot run leaves the node as babysitter without
        # self-healing would (drained, paged by its node_unhealthy alert; a human's
        # reboot that clears the fault returns it); an inspect/rma the ladder chose, or
        # one after a failed rung, holds it for an admin and pages on its own
        common["evidence"]["hold"] = not skipped
        rid = self.ledger.add(
            node,
            rung,
            fault.klass,
            fault.summary,
            Phase.INSPECT,
            now,
            outcome=f"stays drained for a human: {why}",
            **common,
        )
        self._record(ActionKind.INSPECT, node, f"{rung.value}: {fault.summary}", why, rid)
        # the node's episode now (this tick must not start another one on it)
        self.open[node] = self.ledger.history(node, limit=1)[0]
        if skipped:
            log.warning("%s: no automatic %s: %s", node, fault.klass, why)
            return
        firing.append(
            Alert(
                node,
                "remediation_inspect",
                Severity.CRITICAL,
                f"{node} needs {'an RMA' if rung is Rung.RMA else 'hardware inspection'}: "
                f"{fault.summary}",
                f"stays drained, no automatic remediation: {why}",
                now,
                details={"fault_class": fault.klass, "rung": rung.value},
            )
        )

    def _cannot(self, rung: Rung, fault: Fault) -> str:
        """Why an automatic rung cannot run on this cluster for this fault ("" when it can)."""
        if rung is Rung.RESET_GPU and not (fault.gpu_uuid or fault.bus_id):
            return "the fault names no GPU (no UUID, no PCI bus id) to reset"
        if rung is Rung.REBOOT and not self._reboot_program():
            return "slurm.conf has no RebootProgram, so `scontrol reboot` cannot complete"
        return ""

    def _reboot_program(self) -> str:
        if self._program is None or time.monotonic() - self._program[0] > CONFIG_TTL_S:
            try:
                self._program = (time.monotonic(), self.slurm.reboot_program())
            except SlurmError as exc:
                log.warning("cannot read RebootProgram: %s", exc)
                return self._program[1] if self._program else ""
        return self._program[1]

    # ---- limits
    def _reboot_slots(self, node: str) -> bool:
        """Room for one more node in reboot in each of the node's partitions:
        max(K, P x partition size) nodes at once."""
        rebooting = [r.node for r in self.open.values() if r.state is Phase.REBOOTING]
        sn = self.snapshot.nodes.get(node)
        for p in (sn.partitions if sn else ()) or ("default",):
            size = self.snapshot.partitions.get(p, 1)
            limit = max(
                self.cfg.max_concurrent_reboots, int(self.cfg.max_concurrent_fraction * size)
            )
            busy = sum(
                1
                for n in rebooting
                if p
                in ((s.partitions if (s := self.snapshot.nodes.get(n)) else ()) or ("default",))
            )
            if busy >= limit:
                return False
        return True

    def _lemon(
        self, node: str, fault: Fault, count: str, now: datetime, common: dict[str, Any]
    ) -> None:
        """`count` ("3 remediations in 7 days", "3 drains in 7 days") made NODE a lemon."""
        why = f"lemon: {count}, {fault.summary}"
        common["evidence"]["lemon"] = count
        rid = self.ledger.add(
            node,
            Rung.INSPECT,
            fault.klass,
            fault.summary,
            Phase.LEMON,
            now,
            outcome="no more automatic rungs: stays drained for an admin",
            **common,
        )
        try:
            self.admitted.drain(node, why, now)
            self.snapshot.moved_here([(node, why)], [])
            self.store.set_node(node, babysitter_drained=True, drain_reason=why)
            done = "drained with a lemon reason"
        except SlurmError as exc:
            done = f"could not set the lemon reason: {exc}"
        self._record(ActionKind.LEMON, node, why, done, rid)
        self.open[node] = self.ledger.history(node, limit=1)[0]
        log.warning("%s: %s", node, why)

    def _drain_lemon(self, node: str, lemon: DrainLemon, now: datetime) -> None:
        """A fault no rung addresses drained the node again and again (loop/lemons.py)."""
        worst = max(lemon.findings, key=lambda f: f.severity.rank, default=None)
        fault = (
            Fault.of(worst)
            if worst
            else Fault("drain", Action.DRAIN, lemon.last_reason[:300], None, None, None)
        )
        common: dict[str, Any] = {
            "gpu_uuid": fault.gpu_uuid,
            "gpu_serial": fault.gpu_serial,
            "evidence": {"action": fault.action.value, "bus_id": fault.bus_id},
        }
        count = f"{lemon.drains} drains in {self.lemon_drains[1]:g} days"
        self._lemon(node, fault, count, now, common)

    def _lemon_alert(self, rem: Remediation, now: datetime) -> Alert:
        history = rem.evidence.get("history", [])
        # its RMA evidence archive, once stored (controller/loop/heal/rma.py links it here)
        archive = rem.evidence.get("rma_archive")
        return Alert(
            rem.node,
            LEMON_CONDITION,
            Severity.CRITICAL,
            f"{rem.node} is a lemon: "
            + rem.evidence.get(
                "lemon", f"{len(history)} remediations in {self.cfg.lemon_window_days:g} days"
            )
            + f" (latest: {rem.fault})",
            "stays drained; no more automatic remediation until an admin clears the ledger"
            + (f"; RMA evidence: {archive}" if archive else ""),
            rem.created_at,
            details={"history": history, **({"rma_archive": archive} if archive else {})},
        )

    # ---- an episode's progress
    def _issue(self, rem: Remediation, now: datetime, firing: list[Alert]) -> None:
        if rem.rung is Rung.RESTART_FABRIC:
            self.fabric_rung.order(rem, now, self.admission)
            return
        if rem.rung is Rung.RESET_GPU:
            self._order_reset(rem, now)
            return
        if rem.rung is not Rung.REBOOT or not self._reboot_slots(rem.node):
            return
        sn = self.snapshot.nodes.get(rem.node)
        row = self.store.node(rem.node) or {}
        boot_id = (row.get("metrics") or {}).get("boot_id")
        reason = f"reboot: {rem.fault}"
        minutes = int(self.cfg.reboot_timeout_s // 60) + self.validation_minutes
        try:
            # admitted, then the reservation first: the node never comes back open to jobs
            hold = (reservation_name(rem.node), self.validation_user, minutes)
            self.admitted.reboot(rem.node, reason, self.cfg.nextstate, hold, now)
        except (Held, SlurmUnavailable):
            return  # held (controller/loop/admit/admission.py) or Slurm away: asked next tick
        except SlurmError as exc:
            self._fail(rem, now, f"scontrol reboot failed: {exc}", firing)
            return
        self.snapshot.stale = True
        self.ledger.move(
            rem,
            Phase.REBOOTING,
            now,
            f"scontrol reboot ASAP nextstate={self.cfg.nextstate} issued",
            issued_at=now.isoformat(),
            boot_time_before=sn.boot_time if sn else "",
            boot_id_before=boot_id,
        )
        self._record(ActionKind.REBOOT, rem.node, reason, "scontrol reboot ASAP issued", rem.id)
        log.info("%s: reboot issued (%s)", rem.node, rem.fault)

    def _order_reset(self, rem: Remediation, now: datetime) -> None:
        """Order the reset from the node's agent: the order is this open ledger row, handed
        to the agent in the answer to its next report (controller/api/orders.py), until it answers.
        The node stays drained meanwhile (the policy drained it; hold() keeps it so)."""
        target = rem.gpu_uuid or rem.evidence.get("bus_id")
        what = f"GPU reset of {target} ordered from the node's agent"
        ttl = self.cfg.reset_timeout_s  # bound to an expiry (order_permission.py)
        if issue(self.admission, self.ledger, rem, Act.RESET_GPU, now, ttl, what):
            return  # held (controller/loop/admit/admission.py): asked again next tick
        self._record(
            ActionKind.RESET_GPU,
            rem.node,
            f"reset_gpu: {rem.fault}",
            f"ordered from the agent ({target})",
            rem.id,
        )
        log.info("%s: GPU reset of %s ordered (%s)", rem.node, target, rem.fault)

    def _resetting(self, rem: Remediation, now: datetime, firing: list[Alert]) -> None:
        """The agent's answer to the reset order (its report metrics): done -> validation;
        refused or failed -> the next rung; no answer within reset_timeout_s -> the next rung."""
        if rem.rung is Rung.RESTART_FABRIC:  # the same, for a fabric service restart
            got = self.fabric_rung.answer(rem, now)
            if got is not None and got[0]:
                why = f"after a fabric service restart: {rem.fault}"
                self._validate_fresh(rem, now, why, firing, rem.evidence["restart_done_at"])
            elif got is not None:
                self._fail(rem, now, got[1], firing)
            return
        ev = rem.evidence
        if "reset_done_at" in ev:  # done; waits for a full report, or its validation was held
            self._validate_fresh(
                rem, now, f"after GPU reset: {rem.fault}", firing, ev["reset_done_at"]
            )
            return
        row = self.store.node(rem.node) or {}
        got = (row.get("metrics") or {}).get(RESET_METRIC)
        if isinstance(got, dict) and got.get("order") == ev.get("order_id"):
            message = str(got.get("message") or "")[:300]
            if not got.get("ok"):
                # a refused reset never ran: it is no remediation for the lemon count
                rem.evidence["refused"] = bool(got.get("refused"))
                self._fail(rem, now, f"agent: {message}", firing)
                return
            self.ledger.move(
                rem,
                rem.state,
                now,
                message,
                reset_done_at=now.isoformat(),
                reset_duration_s=got.get("duration_s"),
                **after_rung.mark(self.store, rem.node),
            )
            self._record(ActionKind.RESET_GPU, rem.node, f"reset_gpu: {rem.fault}", message, rem.id)
            self._validate_fresh(rem, now, f"after GPU reset: {rem.fault}", firing, now.isoformat())
            return
        issued = datetime.fromisoformat(ev["issued_at"])
        if (now - issued).total_seconds() > self.cfg.reset_timeout_s:
            self._fail(
                rem,
                now,
                f"the agent did not answer the reset order in {self.cfg.reset_timeout_s:g} s",
                firing,
            )

    def _validate_fresh(
        self, rem: Remediation, now: datetime, why: str, firing: list[Alert], done_at: str
    ) -> None:
        """After a reset / restart: validated once the agent's full report after its answer
        is in, never on the stale findings its event answer left open (after_rung.py)."""
        wait = after_rung.waiting(self.store, rem, done_at, now, self.heartbeat_s)
        if wait is None:
            # no reservation holds the node yet: a start held this long is given up (paged)
            held_until = datetime.fromisoformat(done_at) + timedelta(
                minutes=self.validation_minutes
            )
            self._validate(rem, now, why, firing, held_until)
        elif wait:
            self._fail(rem, now, wait, firing)

    def _validate(
        self,
        rem: Remediation,
        now: datetime,
        why: str,
        firing: list[Alert],
        held_until: datetime | None = None,
    ) -> None:
        """The rung is done: the validation job must pass before the node returns.
        `held_until`: when a start still held (unknown, e.g. Slurm will not return the node
        yet) fails the rung instead; a reboot's is the end of its reservation."""
        reserved = None
        if rem.rung is Rung.REBOOT and "issued_at" in rem.evidence:
            # the reservation _issue made with the reboot, not one for the job alone
            minutes = int(self.cfg.reboot_timeout_s // 60) + self.validation_minutes
            reserved = datetime.fromisoformat(rem.evidence["issued_at"]) + timedelta(
                minutes=minutes
            )
            held_until = reserved
        outcome = self.validator.start(rem.node, why, now, reserved_until=reserved)
        if isinstance(outcome, Refusal):
            if outcome.why is Why.UNKNOWN and held_until is not None and now >= held_until:
                # Slurm never let it start while the node was held for it: paged, stays drained
                self._fail(rem, now, f"validation never started: {outcome.reason}", firing)
                return
            # held by the admission step, not a failed rung: the phase stays, asked next tick
            self.ledger.move(rem, rem.state, now, f"validation {outcome}")
            return
        aid = self._validation_action(rem.node)
        if aid is None:
            self._fail(rem, now, outcome, firing)
            return
        self.ledger.move(
            rem,
            Phase.VALIDATING,
            now,
            outcome,
            validation_action=aid,
            validation_started_at=now.isoformat(),
        )

    def _advance(
        self,
        rem: Remediation,
        now: datetime,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
    ) -> None:
        sn = self.snapshot.nodes.get(rem.node)
        in_service = sn is not None and not (sn.drained_or_draining or sn.down)
        if rem.state is Phase.REBOOTING:
            self._rebooting(rem, sn, now, firing)
        elif rem.state is Phase.RESETTING and not in_service:
            self._resetting(rem, now, firing)
        elif rem.state is Phase.VALIDATING:
            self._validating(rem, now, firing, clearing)
        elif rem.state is not Phase.WAITING and in_service:
            # someone returned the node (`babysitter resume`): the episode is over. A reset or
            # fabric restart still ordered is withdrawn with it (the order is this open row);
            # its late answer must not fail the rung and drain a node in service behind the
            # admission step (found by the safety invariants)
            self.ledger.close(rem, now, f"{rem.outcome}; node returned to service by an admin")
            self.open.pop(rem.node, None)
            clearing.append((rem.node, LEMON_CONDITION))
            clearing.append((rem.node, "remediation_inspect"))

    def _rebooting(
        self, rem: Remediation, sn: SlurmNode | None, now: datetime, firing: list[Alert]
    ) -> None:
        ev = rem.evidence
        issued = datetime.fromisoformat(ev["issued_at"])
        if (
            sn is not None
            and sn.flags & REBOOT_FLAGS
            and "reboot_started_at" not in ev
            and ("REBOOT_ISSUED" in sn.flags or sn.down)
        ):
            # Slurm waited for the jobs to end and handed the node to its RebootProgram
            self.ledger.move(rem, rem.state, now, "rebooting", reboot_started_at=now.isoformat())
        booted = (
            sn is not None
            and bool(sn.boot_time)
            and sn.boot_time != ev.get("boot_time_before")
            and not sn.flags & REBOOT_FLAGS
        )
        row = self.store.node(rem.node) or {}
        agent_boot = (row.get("metrics") or {}).get("boot_id")
        if booted and agent_boot and agent_boot != ev.get("boot_id_before"):
            persisting = [f for f in row["open_findings"] if remediable(f)]
            # (once: a held validation is asked again on later ticks)
            at = ev.get("booted_at", now.isoformat())
            self.ledger.move(rem, rem.state, now, "back", booted_at=at, boot_id=agent_boot)
            if persisting:
                self._fail(
                    rem, now, f"fault still there after the reboot: {persisting[0].message}", firing
                )
                return
            self._validate(rem, now, f"after reboot: {rem.fault}", firing)
            return
        if (now - issued).total_seconds() > self.cfg.reboot_timeout_s:
            why = f"not back {self.cfg.reboot_timeout_s:g} s after its reboot"
            # a reboot still pending (jobs never ended) must not happen later, unwatched
            cancelled = cancel_pending_reboot(self.slurm, rem)
            self.ledger.move(rem, Phase.TIMED_OUT, now, "; ".join(filter(None, (why, cancelled))))
            self._record(
                ActionKind.REBOOT,
                rem.node,
                why,
                "; ".join(filter(None, ("paged; stays drained", cancelled))),
                rem.id,
                status=ActionStatus.FAILED,
            )
            firing.append(
                Alert(
                    rem.node,
                    "remediation_timeout",
                    Severity.CRITICAL,
                    f"{rem.node}: {why} ({rem.fault})",
                    "stays out of service for a human",
                    now,
                )
            )

    def _validation_action(self, node: str) -> int | None:
        for a in self.store.actions(status=ActionStatus.RUNNING, limit=200):
            if a.kind is ActionKind.VALIDATE and a.node == node:
                return a.id
        return None

    def _validating(
        self,
        rem: Remediation,
        now: datetime,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
    ) -> None:
        aid = rem.evidence.get("validation_action")
        # by its id: a busy fleet may record hundreds of actions while one validation runs
        action = self.store.action(int(aid)) if aid is not None else None
        if action is None or action.status is ActionStatus.RUNNING:
            return
        if validated_for_this_drain(state_of(action.status)):
            self.ledger.move(
                rem,
                Phase.PASSED,
                now,
                f"validated and back in service: {action.outcome}",
                resumed_at=now.isoformat(),
            )
            clearing.append((rem.node, "remediation_timeout"))
            log.info("%s: healed by %s and validated", rem.node, rem.rung.value)
            return
        # the validator drained it already, with `validation failed: ...` (this tick's Slurm
        # snapshot predates that drain: it must not be drained again over that reason)
        self._fail(rem, now, str(action.outcome or "validation failed"), firing, drained=True)

    def _fail(
        self, rem: Remediation, now: datetime, why: str, firing: list[Alert], drained: bool = False
    ) -> None:
        """The rung did not heal the node: keep it out of service, record it and climb to
        the next rung."""
        sn = self.snapshot.nodes.get(rem.node)
        try:
            self.admitted.end_validation(reservation_name(rem.node))
            if not drained and (sn is None or not (sn.drained_or_draining and self._ours(sn))):
                reason = f"{rem.rung.value} failed: {why}"
                self.admitted.drain(rem.node, reason, now)
                self.snapshot.moved_here([(rem.node, reason)], [])
                self.store.set_node(rem.node, babysitter_drained=True, drain_reason=reason)
        except SlurmError as exc:
            log.warning("%s: cannot hold the node after a failed %s: %s", rem.node, rem.rung, exc)
        self.ledger.move(rem, Phase.FAILED, now, why)
        self.ledger.close(rem, now, why)
        self.open.pop(rem.node, None)
        self._record(
            ActionKind(rem.rung.value), rem.node, rem.fault, why, rem.id, status=ActionStatus.FAILED
        )
        action = Action(rem.evidence.get("action") or Action.REBOOT.value)
        nxt = self.ladder.after(rem.fault_class, action, rem.rung)
        fault = Fault(
            rem.fault_class,
            action,
            rem.fault,
            rem.gpu_uuid,
            rem.gpu_serial,
            rem.evidence.get("bus_id"),
        )
        self._climb(rem.node, fault, nxt, now, firing)

    def _record(
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
        aid = self.store.record_action(
            kind,
            node=node,
            reason=reason[:1000],
            rule=Rule.REMEDIATION,
            requested_by="policy",
            status=status,
            outcome=f"{outcome} (ledger row {rid})"[:1000],
        )
        audit.record_actions(self.store, [aid])
