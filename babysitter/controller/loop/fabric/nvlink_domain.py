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
(kv `nvlink_domain_incidents`), so a restarted controller resumes what it drained. The incident
itself is carried out as a switch's is (incidents.py, grouped by domain).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType

from prometheus_client import CollectorRegistry

from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import metrics_mentioning
from babysitter.controller.loop.admit.admission import Admission
from babysitter.controller.loop.decide import fabric
from babysitter.controller.loop.decide.fabric import Evidence, FabricView, Incident, correlate
from babysitter.controller.loop.decide.node.facts_model import NodeFacts, PolicySettings
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.fabric.incidents import Grouping, IncidentStep, Troubled
from babysitter.controller.loop.read.context import LoopContext
from babysitter.controller.loop.read.guard import NVLINK_DOMAIN_KEY
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Finding, Severity, job_owned
from babysitter.slurm.topology import Switch, Topology

DOMAIN_CHECK = "gpu.fabric"
INCIDENTS_KEY = NVLINK_DOMAIN_KEY  # shown by guard_view (GET /api/v1/guard, babysitter guard)
CONDITION = "nvlink_domain_suspected"
METRIC = "nvlink_domain"
# an agent's word: a cluster UUID and clique id, or a Slurm block's name
_DOMAIN = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/\d{1,10}$")


def is_domain_fault(f: Finding) -> bool:
    """Evidence against the node's NVLink fabric: its own critical fabric reading."""
    return f.check == DOMAIN_CHECK and f.severity is Severity.CRITICAL and not job_owned(f)


def domain_reason(domain: str) -> str:
    """The drain reason (after the prefix)."""
    return DOMAINS.reason(domain)


def domain_condition(domain: str) -> str:
    return f"{CONDITION}_{re.sub(r'[^A-Za-z0-9_.-]', '_', domain)}"


DOMAINS = Grouping(
    noun="NVLink domain",
    store_key=INCIDENTS_KEY,
    condition=domain_condition,
    is_fault=is_domain_fault,
    suspected=Rule.NVLINK_DOMAIN_SUSPECTED,
    recovered=Rule.NVLINK_DOMAIN_RECOVERED,
    gauge=(
        "babysitter_nvlink_domain_incidents",
        "Open nvlink_domain_suspected incidents (NVLink-domain correlation).",
    ),
    records_dry_run_resumes=False,
)


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
    return fabric.onsets(findings, previous, now, is_domain_fault)


def reported_domains(store: Store) -> dict[str, str]:
    """node -> the NVLink domain its last report carried."""
    return {
        name: d
        for name, metrics in metrics_mentioning(store, METRIC)
        if isinstance(metrics, dict) and (d := domain_of(metrics.get(METRIC))) is not None
    }


class DomainStep(IncidentStep):
    """The NVLink-domain step of the remediation tick: correlate before the node policy (and
    hide what a domain incident answers for from it), carry the incidents out after it."""

    def __init__(
        self,
        ctx: LoopContext,
        policy: PolicySettings,
        admission: Admission | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(ctx, DOMAINS, policy, admission, registry)
        self.membership: dict[str, str] = {}
        self._topo, self._topo_for = Topology(), dict[str, str]()
        self._reported: dict[str, str] = {}
        self._reported_at = float("-inf")

    # ---- before the node policy
    def before_policy(self, facts: list[NodeFacts], now: datetime) -> list[NodeFacts]:
        if not self.enabled:
            return facts
        if time.monotonic() - self._reported_at >= self.cfg.slurm.node_refresh_s:
            self._reported_at = time.monotonic()
            self._reported = reported_domains(self.store)
        return self._decide(facts, now)

    def _correlate(self, troubled: Troubled, clean: Mapping[str, int], now: datetime) -> FabricView:
        self.membership = members(self._reported, self.snapshot.topology, troubled)
        if self.membership != self._topo_for:  # rebuilt only when a node moved (cost: O(nodes))
            self._topo, self._topo_for = domain_topology(self.membership), self.membership
        return correlate(self._topo, self._evidence, self.incidents, clean, self.settings, now)

    # ---- after the node policy
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
