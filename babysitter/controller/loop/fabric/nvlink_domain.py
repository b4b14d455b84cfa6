"""NVLink domains as a correlation scope: when the nodes of one NVLink domain (an NVL72 rack:
the GPUs that share one NVLink fabric) report fabric trouble together, the domain is the
suspect, not each node, exactly as a switch is for InfiniBand (controller/loop/decide/fabric.py).

A domain is known from two sources:
- each agent's `gpu.fabric` check ships the node's NVLink domain (the fabric's cluster UUID
  and clique id, `<uuid>/<clique>`) as the report metric `nvlink_domain` (and in its findings'
  details): nodes that report the same value are one domain;
- Slurm's topology/block (`BlockName=...`, which sites use to model NVL72 racks) puts a node
  that does not report a domain (yet) in its block's.

Critical `gpu.fabric` findings (untrained fabric, a training error, unhealthy routes, IMEX
domain down, Fabric Manager down: the node's own readings, never a job's) on at least
`threshold(size)` nodes of one domain within `[fabric] window_s` become one
`nvlink_domain_suspected` incident: one alert naming the domain, its nodes drained in one Slurm
call with the reason `babysitter: NVLink domain <id> suspected`, each drain through the
admission step (controller/loop/admit/admission.py: partition, cluster and domain caps, the hour's
budget). The thresholds, window and hold are the switch correlation's (`[fabric]`); the
correlation itself is fabric.correlate on a topology whose "switches" are the domains. The
nodes resume together once every one reports clean again. Incidents are kept in the store
(kv `nvlink_domain_incidents`), so a restarted controller resumes what it drained.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from sqlalchemy import String, and_, cast, select

from babysitter.controller.db import audit
from babysitter.controller.db import models as m
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.episodes import start_drain_episodes
from babysitter.controller.db.store import Store
from babysitter.controller.loop.admit.admission import Admission
from babysitter.controller.loop.admit.gate import AdmittedSlurm, Held
from babysitter.controller.loop.decide.fabric import (
    Evidence,
    FabricSettings,
    FabricView,
    Incident,
    correlate,
)
from babysitter.controller.loop.decide.policy import (
    NodeFacts,
    PolicyResult,
    PolicySettings,
    Rule,
    drain_worthy,
    facts_verdict,
)
from babysitter.controller.loop.read.context import LoopContext
from babysitter.controller.loop.read.guard import NVLINK_DOMAIN_KEY
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Finding, Severity, job_owned
from babysitter.slurm.client import SlurmNotOwned, SlurmUnavailable
from babysitter.slurm.ownership import automatic_body
from babysitter.slurm.topology import Switch, Topology

log = logging.getLogger(__name__)
DOMAIN_CHECK = "gpu.fabric"
INCIDENTS_KEY = NVLINK_DOMAIN_KEY  # shown by guard_view (GET /api/v1/guard, babysitter guard)
CONDITION = "nvlink_domain_suspected"
METRIC = "nvlink_domain"
RETRY_S = 5.0
# an agent's word: a cluster UUID and clique id, or a Slurm block's name
_DOMAIN = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/\d{1,10}$")


def is_domain_fault(f: Finding) -> bool:
    """Evidence against the node's NVLink fabric: its own critical fabric reading."""
    return f.check == DOMAIN_CHECK and f.severity is Severity.CRITICAL and not job_owned(f)


def domain_reason(domain: str) -> str:
    """The drain reason (after the prefix)."""
    return f"NVLink domain {domain} suspected"


def domain_condition(domain: str) -> str:
    return f"{CONDITION}_{re.sub(r'[^A-Za-z0-9_.-]', '_', domain)}"


def domain_of(value: object) -> str | None:
    return value if isinstance(value, str) and _DOMAIN.match(value) else None


def members(
    reported: Mapping[str, str], blocks: Topology, findings: Mapping[str, Sequence[Finding]]
) -> dict[str, str]:
    """node -> its NVLink domain: what its agent reported (metric, else a finding's details),
    else its Slurm block (topology/block)."""
    out = dict(reported)
    for node, fs in findings.items():
        for f in fs:
            if node not in out and (d := domain_of(f.details.get(METRIC))) is not None:
                out[node] = d
    if blocks.kind == "block":
        for sw in blocks.switches.values():
            if sw.level == 0:
                for n in sw.nodes:
                    out.setdefault(n, f"block {sw.name}")
    return out


def domain_topology(membership: Mapping[str, str]) -> Topology:
    """The domains as level-0 "switches" (no upper level: domains never merge)."""
    groups: dict[str, set[str]] = {}
    for node, d in membership.items():
        groups.setdefault(d, set()).add(node)
    switches = {d: Switch(d, 0, frozenset(nodes)) for d, nodes in groups.items()}
    return Topology(MappingProxyType(switches), "nvlink")


def onsets(
    findings: Mapping[str, Sequence[Finding]], previous: Mapping[str, Evidence], now: datetime
) -> dict[str, Evidence]:
    """Each node's domain evidence, its onset carried over while the trouble lasts."""
    out: dict[str, Evidence] = {}
    for node, fs in findings.items():
        mine = [f for f in fs if is_domain_fault(f)]
        if mine:
            prev = previous.get(node)
            codes = tuple(sorted({f.code for f in mine}))
            out[node] = Evidence(node, prev.since if prev else now, codes)
    return out


def reported_domains(store: Store) -> dict[str, str]:
    """node -> the NVLink domain its last report carried (the text filter runs in the
    database; JSON is decoded only for the rows that pass it)."""
    n = m.nodes
    text = cast(n.c.metrics, String)
    q = select(n.c.name, text).where(and_(n.c.metrics.is_not(None), text.like(f"%{METRIC}%")))
    out: dict[str, str] = {}
    with store.engine.connect() as c:
        for name, raw in c.execute(q):
            try:
                metrics = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError:
                continue
            if isinstance(metrics, dict) and (d := domain_of(metrics.get(METRIC))) is not None:
                out[name] = d
    return out


class DomainStep:
    """The NVLink-domain step of the remediation tick: correlate before the node policy (and
    hide what a domain incident answers for from it), carry the incidents out after it."""

    @property
    def admitted(self) -> AdmittedSlurm:
        """Its Slurm changes, each admitted first (controller/loop/admit/gate.py)."""
        return AdmittedSlurm(self.slurm, self.admission)

    def __init__(
        self,
        ctx: LoopContext,
        policy: PolicySettings,
        admission: Admission | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        cfg = ctx.cfg
        self.cfg, self.store, self.slurm, self.snapshot = cfg, ctx.store, ctx.slurm, ctx.snapshot
        self.policy = policy
        self.admission = admission
        self.settings = FabricSettings.from_config(cfg)
        self.enabled = cfg.fabric.enabled
        self.prefix = cfg.slurm.reason_prefix
        self.incidents: list[Incident] = self._load()
        self.view = FabricView(open=tuple(self.incidents))
        self.membership: dict[str, str] = {}
        self._topo, self._topo_for = Topology(), dict[str, str]()
        self._reported: dict[str, str] = {}
        self._reported_at = float("-inf")
        self._evidence: dict[str, Evidence] = {}
        self._bad: set[str] = set()
        self._returning: frozenset[str] = frozenset()
        self._verdicts: dict[str, str] = {}
        self._refused: dict[str, set[str]] = {}
        self._retry_at: datetime | None = None
        self._decided = False
        self._settled: list[int] = []
        self.g_incidents = Gauge(
            "babysitter_nvlink_domain_incidents",
            "Open nvlink_domain_suspected incidents (NVLink-domain correlation).",
            registry=registry,
        )

    def _load(self) -> list[Incident]:
        raw = self.store.kv_get(INCIDENTS_KEY) or []
        out = []
        for d in raw if isinstance(raw, list) else []:
            try:
                out.append(Incident.from_json(d))
            except (KeyError, TypeError, ValueError):
                log.warning("dropping an unreadable stored NVLink domain incident: %r", d)
        return out

    def _save(self) -> None:
        self.store.kv_set(INCIDENTS_KEY, [i.to_json() for i in self.incidents])

    def _owned(self, reason: str) -> bool:
        """babysitter's automatic reason of a domain incident (slurm/ownership.py decides it
        is babysitter's automatic one at all)."""
        body = automatic_body(reason, self.prefix) or ""
        return body.startswith("NVLink domain ") and body.endswith(" suspected")

    # ---- before the node policy
    def before_policy(self, facts: list[NodeFacts], now: datetime) -> list[NodeFacts]:
        if not self.enabled:
            return facts
        if time.monotonic() - self._reported_at >= self.cfg.slurm.node_refresh_s:
            self._reported_at = time.monotonic()
            self._reported = reported_domains(self.store)
        troubled = {
            n.name: n.open_findings for n in facts if any(map(is_domain_fault, n.open_findings))
        }
        self.membership = members(self._reported, self.snapshot.topology, troubled)
        self._evidence = onsets(troubled, self._evidence, now)
        self._bad = {
            n.name
            for n in facts
            if any(drain_worthy(f) and not is_domain_fault(f) for f in n.open_findings)
        }
        clean = {
            n.name: self.settings.clean_reports if n.name in self._bad else n.consecutive_clean
            for n in facts
        }
        if self.membership != self._topo_for:  # rebuilt only when a node moved (cost: O(nodes))
            self._topo, self._topo_for = domain_topology(self.membership), self.membership
        topo = self._topo
        self.view = correlate(topo, self._evidence, self.incidents, clean, self.settings, now)
        self._decided = True
        self._returning = frozenset(n for inc in self.view.resolved for n in inc.nodes)
        hidden = self.view.held | self.view.covered | self._returning
        self._verdicts = {
            n.name: facts_verdict(n, self.policy)[0] for n in facts if n.name in hidden
        }
        return [self._masked(n) if n.name in hidden else n for n in facts]

    def _masked(self, n: NodeFacts) -> NodeFacts:
        kept = tuple(f for f in n.open_findings if not is_domain_fault(f))
        answered = n.name in self.view.covered or n.name in self._returning
        held = answered and self._owned(n.reason)
        return replace(n, open_findings=kept, consecutive_clean=0 if held else n.consecutive_clean)

    def true_verdicts(self, result: PolicyResult) -> None:
        """A node whose fabric findings were hidden still shows its real verdict."""
        for name, verdict in self._verdicts.items():
            if name in result.verdicts:
                result.verdicts[name] = verdict

    # ---- after the node policy
    def act(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        self._settled = []
        try:
            if self.enabled and self._decided:
                self._incidents(now, firing, clearing)
            elif self.enabled:
                firing.extend(self._alert(inc) for inc in self.incidents)
            self._decided = False
            self.g_incidents.set(len(self.incidents))
        finally:
            audit.record_actions(self.store, self._settled, now)

    def _incidents(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        view = self.view
        before = [i.to_json() for i in self.incidents]
        still = list(view.open)
        for inc in view.opened:
            log.warning("NVLink domain %s suspected: %s", inc.switch, ", ".join(sorted(inc.nodes)))
        retry_due = self._retry_at is None or now >= self._retry_at
        if self.snapshot.ok and retry_due:
            self._drain(still, now)
        for inc in view.resolved:
            if self._return(inc, now):
                clearing.append((None, domain_condition(inc.switch)))
                self._refused.pop(inc.switch, None)
                log.warning("NVLink domain %s healthy again: incident resolved", inc.switch)
            else:
                still.append(inc)
        firing.extend(self._alert(inc) for inc in still)
        self.incidents = still
        if [i.to_json() for i in still] != before:
            self._save()

    def _alert(self, inc: Incident) -> Alert:
        nodes = sorted(inc.nodes)
        reason = domain_reason(inc.switch)
        codes = sorted({c for n in nodes if (e := self._evidence.get(n)) for c in e.codes})
        did = (
            f"drained {len(nodes)} node(s) in one call with reason '{reason}'"
            if not self.policy.dry_run
            else f"dry run: would drain {len(nodes)} node(s) with reason '{reason}'"
        )
        return Alert(
            None,
            domain_condition(inc.switch),
            Severity.CRITICAL,
            f"NVLink domain {inc.switch} suspected: NVLink fabric faults on {len(nodes)} "
            f"node(s) of it within {self.settings.window_s:g} s ({', '.join(nodes)})"
            + (f"; codes: {', '.join(codes)}" if codes else ""),
            did,
            inc.opened_at,
            nodes=nodes,
            details={"nvlink_domain": inc.switch, "nodes": nodes, "codes": codes},
        )

    def _drain(self, incidents: Sequence[Incident], now: datetime) -> None:
        """Every node of an open incident Slurm does not hold yet: one call per domain."""
        for inc in incidents:
            refused = self._refused.setdefault(inc.switch, set())
            todo = [
                n
                for n in sorted(inc.nodes)
                if (sn := self.snapshot.nodes.get(n)) is not None
                and not (sn.drained_or_draining or sn.down)
                and n not in refused
            ]
            reason = domain_reason(inc.switch)
            if not todo:
                continue
            if self.policy.dry_run:
                for n in todo:
                    refused.add(n)
                    self._record(ActionKind.DRAIN, n, reason, Rule.NVLINK_DOMAIN_SUSPECTED,
                                 ActionStatus.DONE, "dry-run", True)  # fmt: skip
                continue
            # admitted first (the gate): a held node is asked again on the next tick
            res = self.admitted.drain_many(todo, reason, now, switch_incident=True)
            todo = [n for n in todo if not isinstance(res[n], Held)]
            done = [n for n in todo if res[n] is None]
            for n in todo:
                err = res[n]
                if isinstance(err, SlurmUnavailable):
                    self._retry_at = now + timedelta(seconds=RETRY_S)
                    continue
                if err is not None:
                    refused.add(n)
                self._record(
                    ActionKind.DRAIN,
                    n,
                    reason,
                    Rule.NVLINK_DOMAIN_SUSPECTED,
                    _status(err),
                    str(err or "ok"),
                )
            if done:
                self.store.update_nodes(
                    {
                        n: {"babysitter_drained": True, "drain_reason": reason, "drained_at": now}
                        for n in done
                    }
                )
                start_drain_episodes(self.store, done)  # old validations no longer count
                self.snapshot.moved_here([(n, reason) for n in done], [])

    def _return(self, inc: Incident, now: datetime) -> bool:
        """The domain is healthy: resume the nodes it holds together (False: Slurm did not
        answer). With validation configured the node policy takes them over instead."""
        reason = f"{self.prefix} {domain_reason(inc.switch)}"
        held = [
            n
            for n in sorted(inc.nodes)
            if (sn := self.snapshot.nodes.get(n)) is not None
            and sn.drained_or_draining
            and sn.reason == reason
            and n not in self._bad
        ]
        if not held or self.policy.validate_before_resume or self.policy.dry_run:
            return True
        if not self.snapshot.ok:
            return False
        res: Mapping[str, Any] = self.admitted.resume_many(held, now)  # admitted first
        held = [n for n in held if not isinstance(res[n], Held)]
        if any(isinstance(e, SlurmUnavailable) for e in res.values()):
            return False
        done = [n for n in held if res.get(n) is None]
        for n in held:
            err = res.get(n)
            self._record(
                ActionKind.RESUME,
                n,
                reason,
                Rule.NVLINK_DOMAIN_RECOVERED,
                _status(err),
                str(err or "ok"),
            )
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


def _status(err: object) -> ActionStatus:
    if err is None:
        return ActionStatus.DONE
    return ActionStatus.SKIPPED if isinstance(err, SlurmNotOwned) else ActionStatus.FAILED
