"""Writing the tick's outcome for its readers (`babysitter status`, the API): each node's
verdict and Slurm state columns, and the blast-radius guard's state and why; each written only
when it changed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.node.decisions import DecisionKind, PolicyResult
from babysitter.controller.loop.decide.node.drain_guard import drain_limit
from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.read.guard import GUARD_INFO_KEY
from babysitter.controller.loop.read.snapshot import SlurmSnapshot
from babysitter.slurm.client import SlurmNode
from babysitter.slurm.ownership import ReasonOwner, reason_owner


def _drained(values: dict[str, Any]) -> bool:
    return "DRAIN" in str(values.get("slurm_state") or "").split("+")


class OutcomeWriter:
    def __init__(self, store: Store, settings: PolicySettings, snapshot: SlurmSnapshot) -> None:
        self.store = store
        self.settings = settings
        self.snapshot = snapshot  # the nodes' Slurm state, written next to their verdicts
        self._written: dict[str, dict[str, Any]] = {}  # node columns last written
        self._guard_written: dict[str, Any] | None = None
        # the tick's verdicts and facts by node, between `prepare` and `verdicts`
        self._tick: tuple[dict[str, str], dict[str, NodeFacts]] | None = None

    def prepare(self, result: PolicyResult, facts: list[NodeFacts]) -> None:
        """The tick's verdicts, known before it moves nodes: a node it drains or resumes has
        them written with its move (`columns`), its row written once in the tick."""
        self._tick = (result.verdicts, {f.name: f for f in facts})

    def columns(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """The verdict columns of these nodes, as `verdicts` would write them now, for those
        whose columns changed (and only these columns: a drain made by someone else, dated
        here, is left to `verdicts`). Not marked written until `written`."""
        if self._tick is None:
            return {}
        verdicts, facts_by_name = self._tick
        named = {n: v for n in names if (v := verdicts.get(n)) is not None}
        changes, _ = self._changes(named, facts_by_name)
        return {n: v for n, v in changes.items() if "drained_at" not in v}

    def written(self, columns: dict[str, dict[str, Any]]) -> None:
        """`columns` were written with the nodes' moves: `verdicts` writes them only if they
        change again in this tick."""
        self._written.update(columns)

    def verdicts(self, result: PolicyResult, facts: list[NodeFacts]) -> None:
        """Each decided node's verdict and Slurm state columns, written when they change."""
        self._tick = None
        changes, written = self._changes(result.verdicts, {f.name: f for f in facts})
        if changes:
            self.store.update_nodes(changes)
            self._written.update(written)

    def _changes(
        self, verdicts: dict[str, str], facts_by_name: dict[str, NodeFacts]
    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """(the columns to write, the columns as they will then be) of the nodes whose verdict
        or Slurm state columns changed since they were last written."""
        changes: dict[str, dict[str, Any]] = {}
        written: dict[str, dict[str, Any]] = {}
        for name, verdict in verdicts.items():
            sn = self.snapshot.nodes.get(name)
            running = facts_by_name.get(name)
            if running is not None and running.validation == "running":
                verdict = "validating"
            values: dict[str, Any] = {"verdict": verdict}
            if sn is not None:
                values["slurm_state"] = "+".join([sn.state, *sorted(sn.flags)])
                values["slurm_reason"] = sn.reason or None
            old = self._written.get(name)
            if old != values:
                written[name] = changes[name] = values
                if _drained(values) and old is not None and not _drained(old) and self._foreign(sn):
                    # a drain someone else made in Slurm: when it began, for the age of stuck
                    # drains (babysitter's and an admin's through it set it when they drain,
                    # this tick's included: the facts predate them)
                    changes[name] = {**values, "drained_at": datetime.now(UTC)}
        return changes, written

    def _foreign(self, sn: SlurmNode | None) -> bool:
        """The node's drain is not one babysitter carried out (its automation's, an admin's
        through it): its reason is someone else's, or the HealthCheckProgram's."""
        owner = reason_owner(sn.reason if sn else "", self.snapshot.cfg.slurm.reason_prefix)
        return owner not in (ReasonOwner.AUTOMATIC, ReasonOwner.MANUAL)

    def guard(self, result: PolicyResult, cluster: ClusterFacts, now: datetime) -> None:
        """The guard's state and why, for `babysitter status` and GET /api/v1/guard."""
        prev = self.store.kv_get(GUARD_INFO_KEY) or {}
        trip = next((d for d in result.decisions if d.kind is DecisionKind.GUARD_TRIPPED), None)
        unsized = next((d for d in result.decisions if d.rule == "guard_unknown"), None)
        tripped = bool(result.guard_tripped)
        if tripped and prev.get("tripped"):
            rule, reason, since = prev.get("rule"), prev.get("reason"), prev.get("since")
            if trip is not None:
                reason = trip.reason
        elif tripped:
            rule = trip.rule if trip else "guard_tripped"
            reason = trip.reason if trip else "breaker tripped earlier; needs an admin reset"
            since = now.isoformat()
        else:
            rule, reason, since = "", "", None
        s = self.settings
        info: dict[str, Any] = {
            "tripped": tripped,
            "rule": rule,
            "reason": reason,
            "since": since,
            "blocked": _names(trip.details.get("blocked") if trip else None),
            "slurm_data": bool(cluster.partition_sizes),
            "undecided": _names(unsized.details.get("blocked") if unsized else None),
            "undecided_reason": unsized.reason if unsized else "",
            "limits": {
                "max_drained_fraction": s.max_drained_fraction,
                "min_drainable": s.min_drainable,
                "max_drains_per_hour": s.max_drains_per_hour,
            },
            "drains_last_hour": cluster.drains_last_hour,
            "partitions": {
                p: {
                    "size": n,
                    "drained_by_babysitter": cluster.drained_by_us.get(p, 0),
                    "may_drain": int(drain_limit(n, s)),
                }
                for p, n in sorted(cluster.partition_sizes.items())
            },
        }
        if info != self._guard_written:
            self.store.kv_set(GUARD_INFO_KEY, info)
            self._guard_written = info


def _names(value: object) -> list[str]:
    """The node names a decision's details carry (a list of str), or []."""
    return [str(v) for v in value] if isinstance(value, list) else []
