"""The incident mechanism shared by every grouping of nodes (switches from Slurm's topology,
NVLink domains): when enough nodes of one group report trouble together, the group is the
suspect, not each node (the pure decision: controller/loop/decide/fabric.py).

An incident is carried out here the same way whatever the grouping: one alert per suspected
group, its nodes drained in one Slurm call through the admission step
(controller/loop/admit/admission.py: each drain counts towards the partition and cluster caps
and the hour's budget, not the group's own cap), and the nodes resumed together once the
group is healthy again. Until then the node policy does not see the findings an incident
answers for, though what people read about those nodes stays their real verdict. Open
incidents are kept in the store, so a restarted controller resumes what it drained. What
differs between groupings (how nodes are grouped, the alert) is each step's own
(fabric_loop.py, nvlink_domain.py); the names and wording are its `Grouping`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from babysitter.controller.db import audit
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.episodes import start_drain_episodes
from babysitter.controller.loop.admit.admission import Admission
from babysitter.controller.loop.admit.gate import AdmittedSlurm, Held
from babysitter.controller.loop.decide.fabric import (
    Evidence,
    FabricSettings,
    FabricView,
    Incident,
    onsets,
)
from babysitter.controller.loop.decide.node.decisions import PolicyResult
from babysitter.controller.loop.decide.node.facts_model import NodeFacts, PolicySettings
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.decide.node.verdict import drain_worthy, facts_verdict
from babysitter.controller.loop.read.context import LoopContext
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Finding
from babysitter.slurm.client import SlurmError, SlurmNotOwned, SlurmUnavailable
from babysitter.slurm.ownership import automatic_body

log = logging.getLogger(__name__)
RETRY_S = 5.0  # a group's drain/resume that Slurm could not take is tried again after this
Troubled = Mapping[str, Sequence[Finding]]  # node -> its findings, for nodes with a fault


@dataclass(frozen=True)
class Grouping:
    """One kind of incident: what counts against a group, and how it is named."""

    noun: str  # "switch": its Slurm reason is `<noun> <group> suspected`, and its log lines
    store_key: str  # the kv key its open incidents are kept under
    condition: Callable[[str], str]  # a group's alert condition
    is_fault: Callable[[Finding], bool]  # a finding that is evidence against the node's group
    suspected: Rule
    recovered: Rule
    gauge: tuple[str, str]  # the open incidents' gauge: name, help
    # a dry run records the resumes it would do (switches do; NVLink domains never did)
    records_dry_run_resumes: bool = True

    def reason(self, group: str) -> str:
        """The drain reason (after the prefix)."""
        return f"{self.noun} {group} suspected"

    def owns(self, body: str) -> bool:
        """A drain reason's body (prefix removed) is one of this grouping's incidents."""
        return body.startswith(f"{self.noun} ") and body.endswith(" suspected")


def status_of(err: SlurmError | None) -> ActionStatus:
    """What became of one node's drain/resume in a group's batch."""
    if err is None:
        return ActionStatus.DONE
    return ActionStatus.SKIPPED if isinstance(err, SlurmNotOwned) else ActionStatus.FAILED


def _at_once(_item: str, fn: Callable[[], Any]) -> Any:
    return fn()


class IncidentStep:
    """A grouping's step of the remediation tick: correlate before the node policy (and hide
    what an incident answers for from it), carry the incidents out after it. A grouping's
    step says how its nodes are grouped (`_correlate`) and what its alert reads (`_alert`)."""

    @property
    def admitted(self) -> AdmittedSlurm:
        """Its Slurm changes, each admitted first (controller/loop/admit/gate.py)."""
        return AdmittedSlurm(self.slurm, self.admission)

    def __init__(
        self,
        ctx: LoopContext,
        grouping: Grouping,
        policy: PolicySettings,
        admission: Admission | None,
        registry: CollectorRegistry | None,
        isolated: Callable[..., Any] = _at_once,
    ) -> None:
        cfg = self.cfg = ctx.cfg
        self.grouping = grouping
        self.store, self.slurm, self.snapshot = ctx.store, ctx.slurm, ctx.snapshot
        self.policy = policy
        self.admission = admission  # asked before each drain/resume
        self.isolated = isolated
        self.settings = FabricSettings.from_config(cfg)
        self.enabled = cfg.fabric.enabled
        self.prefix = cfg.slurm.reason_prefix
        self._evidence: dict[str, Evidence] = {}
        self.incidents: list[Incident] = self._load()
        self.view = FabricView(open=tuple(self.incidents))
        self._decided = False  # a view was decided this tick
        self._bad: set[str] = set()  # nodes with a drain-worthy finding of another kind
        self._returning: frozenset[str] = frozenset()  # nodes of incidents resolved this tick
        self._verdicts: dict[str, str] = {}  # real verdicts of the nodes hidden this tick
        self._refused: dict[str, set[str]] = {}  # group -> nodes Slurm would not drain
        self._retry_at: datetime | None = None
        self._settled: list[int] = []  # this tick's actions, audited at its end
        self.g_incidents = Gauge(*grouping.gauge, registry=registry)

    # ---- what a grouping says
    def _correlate(self, troubled: Troubled, clean: Mapping[str, int], now: datetime) -> FabricView:
        """fabric.correlate over this grouping's groups."""
        raise NotImplementedError

    def _alert(self, inc: Incident) -> Alert:
        raise NotImplementedError

    def _drains(self) -> bool:
        """Whether the nodes of an incident are drained (else left in service)."""
        return True

    def _requeue_away(
        self, view: FabricView, still: list[Incident], now: datetime
    ) -> list[Incident]:
        """The open incidents, with the jobs requeued away from their new nodes (none here)."""
        return still

    def _after(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        """What the step publishes after the incidents."""
        self.g_incidents.set(len(self.incidents))

    # ---- state
    def _load(self) -> list[Incident]:
        raw = self.store.kv_get(self.grouping.store_key) or []
        out = []
        for d in raw if isinstance(raw, list) else []:
            try:
                out.append(Incident.from_json(d))
            except (KeyError, TypeError, ValueError):
                log.warning("dropping an unreadable stored %s incident: %r", self.grouping.noun, d)
        return out

    def _save(self) -> None:
        self.store.kv_set(self.grouping.store_key, [i.to_json() for i in self.incidents])

    def _owned(self, reason: str) -> bool:
        """babysitter's automatic reason of this grouping's incident (slurm/ownership.py
        decides it is babysitter's automatic one at all)."""
        return self.grouping.owns(automatic_body(reason, self.prefix) or "")

    # ---- before the node policy
    def _decide(self, facts: list[NodeFacts], now: datetime) -> list[NodeFacts]:
        """Correlate, then the facts the node policy decides on: the grouping's findings of
        held and covered nodes hidden, and a node an incident holds drained not the node
        policy's to resume."""
        fault = self.grouping.is_fault
        troubled = {n.name: n.open_findings for n in facts if any(map(fault, n.open_findings))}
        self._evidence = onsets(troubled, self._evidence, now, fault)
        self._bad = {
            n.name for n in facts if any(drain_worthy(f) and not fault(f) for f in n.open_findings)
        }
        # a node with a fault of its own does not hold its group's incident open: the others
        # return without it, and it stays the node policy's
        clean = {
            n.name: self.settings.clean_reports if n.name in self._bad else n.consecutive_clean
            for n in facts
        }
        self.view = self._correlate(troubled, clean, now)
        self._decided = True
        # the nodes of an incident resolved now return together in act(), not one by one
        self._returning = frozenset(n for inc in self.view.resolved for n in inc.nodes)
        hidden = self.view.held | self.view.covered | self._returning
        # what people read about these nodes stays the truth: their own verdict
        self._verdicts = {
            n.name: facts_verdict(n, self.policy)[0] for n in facts if n.name in hidden
        }
        if hidden:
            facts = [self._masked(n) if n.name in hidden else n for n in facts]
        return facts

    def _masked(self, n: NodeFacts) -> NodeFacts:
        kept = tuple(f for f in n.open_findings if not self.grouping.is_fault(f))
        answered = n.name in self.view.covered or n.name in self._returning
        held = answered and self._owned(n.reason)
        return replace(n, open_findings=kept, consecutive_clean=0 if held else n.consecutive_clean)

    def true_verdicts(self, result: PolicyResult) -> None:
        """The node policy decided on facts with the grouping's findings hidden; the verdicts
        it writes for those nodes are their real ones (a node with its port down is never
        shown healthy)."""
        for name, verdict in self._verdicts.items():
            if name in result.verdicts:
                result.verdicts[name] = verdict

    # ---- after the node policy
    def act(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        """Carry out the incidents, then publish."""
        self._settled = []
        try:
            # only a view decided this tick is acted on (a failed correlation acts on nothing
            # twice); the open incidents' alerts are kept alive either way
            if self.enabled and self._decided:
                self._incidents(now, firing, clearing)
            elif self.enabled:
                firing.extend(self._alert(inc) for inc in self.incidents)
            self._decided = False
            self._after(now, firing, clearing)
        finally:
            # who did what to which node, on what evidence (controller/db/audit.py)
            self.isolated("audit", lambda: audit.record_actions(self.store, self._settled, now))

    def _incidents(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        view, noun = self.view, self.grouping.noun
        before = [i.to_json() for i in self.incidents]
        for inc in view.opened:
            log.warning("%s %s suspected: %s", noun, inc.switch, ", ".join(sorted(inc.nodes)))
        still = self._requeue_away(view, list(view.open), now)
        retry_due = self._retry_at is None or now >= self._retry_at
        if self._drains() and self.snapshot.ok and retry_due:
            self._drain(still, now)
        for inc in view.resolved:
            if self._return(inc, now):
                clearing.append((None, self.grouping.condition(inc.switch)))
                self._refused.pop(inc.switch, None)
                log.warning("%s %s healthy again: incident resolved", noun, inc.switch)
            else:
                still.append(inc)  # resumed next time Slurm answers
        firing.extend(self._alert(inc) for inc in still)
        self.incidents = still
        if [i.to_json() for i in still] != before:
            self._save()

    def _drain(self, incidents: Sequence[Incident], now: datetime) -> None:
        """Every node of an open incident that Slurm does not hold yet: one drain call per
        group (again on the next tick for what Slurm could not take then)."""
        suspected = self.grouping.suspected
        for inc in incidents:
            refused = self._refused.setdefault(inc.switch, set())
            todo = [
                n
                for n in sorted(inc.nodes)
                if (sn := self.snapshot.nodes.get(n)) is not None
                and not (sn.drained_or_draining or sn.down)
                and n not in refused
            ]
            reason = self.grouping.reason(inc.switch)
            if not todo:
                continue
            if self.policy.dry_run:
                for n in todo:
                    refused.add(n)
                    self._record(
                        ActionKind.DRAIN, n, reason, suspected, ActionStatus.DONE, "dry-run", True
                    )
                continue
            # its drains count towards the caps and the drain budget like any other (the
            # gate asks the admission step); a held node is asked again on the next tick
            res = self.admitted.drain_many(todo, reason, now, switch_incident=True)
            todo = [n for n in todo if not isinstance(res[n], Held)]
            done = [n for n in todo if res[n] is None]
            for n in todo:
                err = res[n]
                if isinstance(err, SlurmUnavailable):
                    self._retry_at = now + timedelta(seconds=RETRY_S)
                    continue
                if err is not None:
                    refused.add(n)  # someone else's drain, or Slurm refused: not retried
                status = status_of(err)
                self._record(ActionKind.DRAIN, n, reason, suspected, status, str(err or "ok"))
            if done:
                self._drained(done, reason, now)

    def _drained(self, done: list[str], reason: str, now: datetime) -> None:
        self.store.update_nodes(
            {
                n: {"babysitter_drained": True, "drain_reason": reason, "drained_at": now}
                for n in done
            }
        )
        start_drain_episodes(self.store, done)  # old validations no longer count
        self.snapshot.moved_here([(n, reason) for n in done], [])

    def _return(self, inc: Incident, now: datetime) -> bool:
        """The group is healthy: resume its nodes together (those it holds, without a fault of
        their own). With validation configured each returns through its own validation job
        instead (the node policy takes them over). False: Slurm did not answer."""
        reason = f"{self.prefix} {self.grouping.reason(inc.switch)}"
        recovered = self.grouping.recovered
        held = [
            n
            for n in sorted(inc.nodes)
            if (sn := self.snapshot.nodes.get(n)) is not None
            and sn.drained_or_draining
            and sn.reason == reason
            and n not in self._bad
        ]
        if not held or self.policy.validate_before_resume:
            return True
        if self.policy.dry_run:
            for n in held if self.grouping.records_dry_run_resumes else ():
                self._record(
                    ActionKind.RESUME, n, reason, recovered, ActionStatus.DONE, "dry-run", True
                )
            return True
        if not self.snapshot.ok:
            return False
        res = self.admitted.resume_many(held, now)  # admitted first
        held = [n for n in held if not isinstance(res[n], Held)]
        if any(isinstance(e, SlurmUnavailable) for e in res.values()):
            return False
        done = [n for n in held if res.get(n) is None]
        for n in held:
            err = res.get(n)
            self._record(ActionKind.RESUME, n, reason, recovered, status_of(err), str(err or "ok"))
        if done:
            self.store.update_nodes(
                {
                    n: {"babysitter_drained": False, "drain_reason": None, "consecutive_clean": 0}
                    for n in done
                }
            )
            self.snapshot.moved_here([], done)
        return True

    def _record(
        self,
        kind: ActionKind,
        node: str,
        reason: str,
        rule: Rule,
        status: ActionStatus,
        outcome: str,
        dry_run: bool = False,
    ) -> None:
        aid = self.store.record_action(
            kind,
            node=node,
            reason=reason,
            rule=rule,
            requested_by=str(audit.Actor.FABRIC),
            status=status,
            outcome=outcome[:1000],
            dry_run=dry_run,
        )
        self._settled.append(aid)
