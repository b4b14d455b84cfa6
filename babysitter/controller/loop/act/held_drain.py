"""Is a drain that waited still wanted? A drain the node policy decided can wait a long time
before it goes to Slurm: held by the admission step (a cap full, a count unknown) or queued
through a slurmctld outage. If the node's fault cleared meanwhile, carrying it out would drain
a node on stale evidence. Right before such a drain runs, the node's current state (the node
row the ingest keeps: open findings, clean reports in a row) must still warrant it; if not, the
drain is skipped with the outcome `fault cleared while held` (audited like any settled action).

Only the node policy's own drains are asked (rules critical_finding and drain_action): an
admin's drain is theirs, and a switch incident's drain rests on its neighbours' evidence, not
on the node's own. A node with no row is not known to be clear: its drain stands (draining is
the safe side)."""

from __future__ import annotations

from babysitter.controller.db.actions import Action, ActionKind
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.decide.node.verdict import drain_worthy

CLEARED = "fault cleared while held"
NODE_POLICY_DRAINS = frozenset({Rule.CRITICAL_FINDING.value, Rule.DRAIN_ACTION.value})


def cleared_while_held(store: Store, a: Action) -> str | None:
    """None: the drain is still wanted (or not the node policy's to re-check); else the
    outcome to skip it with."""
    if a.kind is not ActionKind.DRAIN or not a.node or a.requested_by != "policy":
        return None
    if a.rule not in NODE_POLICY_DRAINS:
        return None
    row = store.node(a.node)
    if row is None:
        return None
    open_bad = [f for f in row["open_findings"] if drain_worthy(f)]
    clean = int(row.get("consecutive_clean") or 0)
    if open_bad and clean == 0:
        return None
    why = "no drain-worthy finding open" if not open_bad else f"{clean} clean report(s) since"
    return f"{CLEARED}: {why}"
