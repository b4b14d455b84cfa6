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

The steps are a state machine: states.py maps each phase of a ledger row to the one function
that moves it on (waiting.py, rebooting.py, resetting.py, validating.py, held.py; a new row
or the next rung: start.py, fail.py). The Healer below keeps the tick's order and dispatches.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from babysitter.controller.db.tickstore import open_findings
from babysitter.controller.loop.admit.maintenance import MAINTENANCE_UNKNOWN, maintenance_unknown
from babysitter.controller.loop.admit.order_permission import expire_quiet
from babysitter.controller.loop.decide.node.decisions import Decision, DecisionKind
from babysitter.controller.loop.decide.ownership import Owner, episode_owner
from babysitter.controller.loop.heal.episode.base import (
    CONFIG_TTL_S,
    LEMON_CONDITION,
    REBOOT_FLAGS,
    HealerBase,
    Tick,
)
from babysitter.controller.loop.heal.episode.fault import Fault
from babysitter.controller.loop.heal.episode.lemon_episode import drain_lemon, lemon_alert
from babysitter.controller.loop.heal.episode.resetting import RESET_METRIC
from babysitter.controller.loop.heal.episode.start import Opening, open_all, start
from babysitter.controller.loop.heal.episode.states import Handler, transition
from babysitter.controller.loop.heal.lemons import drain_lemons
from babysitter.controller.loop.heal.takeover import end_taken_over
from babysitter.controller.loop.read.ledger import ACTIVE, Phase, Remediation
from babysitter.controller.loop.record.alerts import Alert
from babysitter.slurm.client import SlurmNode

# their homes moved with the split; imported from here before it
__all__ = ["CONFIG_TTL_S", "LEMON_CONDITION", "REBOOT_FLAGS", "RESET_METRIC", "Fault", "Healer"]

# the policy's decisions an open episode makes itself (the healer validates and resumes)
_HEALER_MOVES = (DecisionKind.RESUME, DecisionKind.VALIDATE)


class Healer(HealerBase):
    # ---- the policy's side
    def hold(self, decisions: list[Decision], now: datetime) -> list[Decision]:
        """The policy's decisions minus those an open episode owns: no resume or validation
        (the healer validates and resumes), no drain while a reboot or validation runs, and
        the ledger's lemon instead of the policy's drain count. While the maintenance windows
        cannot be read, no drain, resume or validation at all (a window may cover any node)."""
        if not self.maintenance_known:
            moves = (DecisionKind.DRAIN, DecisionKind.RESUME, DecisionKind.VALIDATE)
            decisions = [d for d in decisions if d.kind not in moves]
        if not self.enabled:
            return decisions
        self.open = self._open_by_node(now)
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
            {n for n in asked - self.open.keys() if self.ours(self.snapshot.nodes.get(n))},
            datetime.now(UTC),
            days,
            limit,
        )
        return [d for d in decisions if not self._owned(d)]

    def _owned(self, d: Decision) -> bool:
        """The decision is the healer's to make (hold() drops it)."""
        if d.node in self._drain_lemons and d.kind in _HEALER_MOVES:
            return True  # a lemon now (step): stays drained for an admin
        rem = self.open.get(d.node or "")
        if rem is not None and not rem.evidence.get("hold", True):
            rem = None  # escalated only because this cluster cannot act: not held
        if rem is not None and d.kind in _HEALER_MOVES:
            return True
        if rem is not None and rem.state in ACTIVE and d.kind is DecisionKind.DRAIN:
            return True
        return d.kind is DecisionKind.ESCALATE and d.condition == LEMON_CONDITION

    def _open_by_node(self, now: datetime) -> dict[str, Remediation]:
        # the tick's view of the ledger: its open rows, and the lemon count's rows of the
        # window for the episodes this tick may start (one read for both)
        rows = self.ledger.view(now - timedelta(days=self.cfg.lemon_window_days))
        out: dict[str, Remediation] = {}
        for r in (r for r in rows if r.open):
            out[r.node] = r  # the newest open row is the node's episode
        return out

    # ---- the loop step
    def step(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        """One tick: each open episode moves on (states.py), new episodes start on the
        nodes the policy drained, then the rungs decided wait for their turn."""
        if not self.maintenance_known:
            firing.append(maintenance_unknown(now))
            self._lemon_alerts(now, firing)
            return  # a window may have opened on any node since the last read: no step
        clearing.append((None, MAINTENANCE_UNKNOWN))
        if not self.enabled or not self.snapshot.ok:
            self._lemon_alerts(now, firing)
            return
        tick = Tick(now, firing, clearing)
        self.open = self._open_by_node(tick.now)
        unsure = self._advance_open(tick)
        self._start_new(tick)
        self._after_starts(tick, unsure)
        self._lemon_alerts(now, firing)

    def _advance_open(self, tick: Tick) -> set[str]:
        """Each open episode's step; the nodes whose owner cannot be read this tick."""
        unsure: set[str] = set()  # nodes whose owner cannot be read this tick: no step
        for node, rem in list(self.open.items()):
            if node in self.quiet:
                # no step while an admin is on it, but an order out does not outlive its
                # expiry there (order_permission.py): it would never time out otherwise
                ttl = self.cfg.reset_timeout_s
                if expire_quiet(self.ledger, rem, tick.now, ttl, self.record):
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
                    end_taken_over(self.store, self.slurm, rem, sn, tick.now)
                    self.open.pop(node)
                    continue
            got = transition(rem.state)
            if got is not None and not got.after_starts:
                got.handler(self, rem, tick)
        return unsure

    def _start_new(self, tick: Tick) -> None:
        """An episode for each node the policy drained for a remediable fault, and a lemon
        row for each node drained too often for a fault no rung addresses."""
        candidates = [
            n
            for n in sorted((self.snapshot.held | self._dry_drains) - self.open.keys() - self.quiet)
            if n in self._dry_drains or self._startable(self.snapshot.nodes.get(n))
        ]
        # one read for all of them: a cluster may hold many drained nodes
        found = open_findings(self.store, candidates) if candidates else {}
        batch: list[Opening] = []  # written together: a rack's starts in one statement
        for node in sorted(found):
            start(self, node, found[node], tick.now, tick.firing, batch)
        open_all(self, batch, tick.now, tick.firing)
        for node, lemon in self._drain_lemons.items():
            if node not in self.open and node not in self.quiet and not self.dry_run:
                drain_lemon(self, node, lemon, tick.now)

    def _after_starts(self, tick: Tick, unsure: set[str]) -> None:
        """The phases whose step waits for this tick's starts (waiting: issued now, in row
        order, so the oldest gets a reboot slot first)."""
        later: list[tuple[Remediation, Handler]] = sorted(
            (
                (r, got.handler)
                for node, r in self.open.items()
                if (got := transition(r.state)) is not None
                and got.after_starts
                and node not in self.quiet | unsure
            ),
            key=lambda pair: pair[0].id,
        )
        for rem, handler in later:
            handler(self, rem, tick)

    def _lemon_alerts(self, now: datetime, firing: list[Alert]) -> None:
        """Asserted every tick, a held one too: an alert not asserted is resolved (the
        engine's per-tick conditions), and a lemon is still a lemon while the loop holds."""
        for rem in self.open.values():
            if rem.state is Phase.LEMON:
                firing.append(lemon_alert(self, rem))

    def _startable(self, sn: SlurmNode | None) -> bool:
        """Drained by the policy and not already in a reboot of Slurm's."""
        return sn is not None and self.ours(sn) and not sn.flags & REBOOT_FLAGS
