"""The audit log: who did what to which node, when, on what evidence, with what result.

Every action babysitter takes or an admin asks for ends up here: an admin's request when it is
made (result `requested`), and every action when it settles (done, failed, skipped, dry_run),
with the open findings of its node at that moment as evidence. Entries are kept in the store
for `controller.audit_retention_days` (pruned by the retention thread), read with
`babysitter audit` and GET /api/v1/audit.

Other parts of the controller record through `record` (an entry they build) or
`record_actions` (entries from settled rows of the actions table).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, select

from babysitter.controller.db import models as m
from babysitter.controller.db.actions import Action as Recorded
from babysitter.controller.db.store import Store, aware, now, stored_action_row

MAX_EVIDENCE = 20  # findings kept per entry: a node with 256 open ones is summarised
MAX_TEXT = 2000


class AuditResult(StrEnum):
    REQUESTED = "requested"  # an admin asked; the settled entry follows
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"  # e.g. a node babysitter does not own
    DRY_RUN = "dry_run"  # decided, nothing changed in Slurm


class Actor(StrEnum):
    POLICY = "policy"  # the remediation loop on its own
    ADMIN = "admin"  # an admin token (API or CLI)
    MAINTENANCE = "maintenance"  # a maintenance window ending on its deadline
    FABRIC = "fabric"  # a switch incident (controller/loop/fabric/fabric_loop.py)
    SDC = "sdc"  # the periodic SDC test's holds (controller/loop/sdc/schedule.py)


_RESULTS = {str(r): r for r in AuditResult}


@dataclass(frozen=True)
class AuditEntry:
    kind: str  # drain resume requeue requeue_jobs guard guard_reset validate maintenance_* ...
    actor: str  # an Actor, optionally with who: "admin (alice@login1)"
    result: AuditResult
    node: str | None = None
    job_id: int | None = None
    action_id: int | None = None
    rule: str | None = None
    reason: str | None = None
    outcome: str | None = None
    evidence: list[dict[str, Any]] = field(default_factory=list)  # Finding.to_json_dict()s
    at: datetime = field(default_factory=now)
    id: int | None = None  # set when read back

    def row(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "actor": self.actor[:128],
            "kind": self.kind[:32],
            "node": self.node,
            "job_id": self.job_id,
            "action_id": self.action_id,
            "rule": self.rule,
            "reason": _clip(self.reason),
            "result": str(self.result),
            "outcome": _clip(self.outcome),
            "evidence": self.evidence[:MAX_EVIDENCE],
        }

    def to_json_dict(self) -> dict[str, Any]:
        d = self.row()
        d["id"] = self.id
        d["at"] = self.at.isoformat()
        return d


def _clip(text: str | None) -> str | None:
    return text if text is None or len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


def actor_of(requested_by: str | None, who: str | None = None) -> str:
    """An actions row's `requested_by` as an actor, with who asked when known."""
    base = requested_by or Actor.POLICY
    return f"{base} ({who})" if who else base


# entries written by this process, by (kind, rule, result): babysitter_actions_total
_totals: Counter[tuple[str, str, str]] = Counter()
_totals_lock = threading.Lock()


def totals() -> dict[tuple[str, str, str], int]:
    with _totals_lock:
        return dict(_totals)


def record(store: Store, *entries: AuditEntry) -> None:
    """Write entries in one transaction; inside the tick, with the rest of the tick's at its
    end (each step's entries were a statement of their own)."""
    if not entries:
        return
    held = store.reads.deferred("audit_log", lambda rows: _write(store, rows))
    if held is not None:
        held.extend(e.row() for e in entries)
    else:
        _write(store, [e.row() for e in entries])
    with _totals_lock:
        _totals.update((e.kind, e.rule or "", str(e.result)) for e in entries)


def _write(store: Store, rows: list[dict[str, Any]]) -> None:
    with store.engine.begin() as c:
        c.execute(m.audit_log.insert(), rows)


EVIDENCE_READS = ("nodes.open_findings",)
EVIDENCE_KEY = "audit_evidence"  # a node's evidence is remembered under (EVIDENCE_KEY, node)


def evidence(store: Store, nodes: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each node's open findings (as stored, JSON dicts), in one read of the nodes no read of
    the tick has read (the policy's node rows, an earlier audit)."""
    names = sorted({n for n in nodes if n})
    if not names:
        return {}

    def read(keys: list[tuple[str, str]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
        wanted = [k[1] for k in keys]
        q = select(m.nodes.c.name, m.nodes.c.open_findings).where(m.nodes.c.name.in_(wanted))
        with store.reading() as c:
            return {(EVIDENCE_KEY, name): kept(found) for name, found in c.execute(q)}

    got = store.reads.read_many(EVIDENCE_READS, [(EVIDENCE_KEY, n) for n in names], read)
    return {k[1]: list(found) for k, found in got.items()}


def kept(found: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The open findings an entry keeps as its evidence."""
    return list(found or [])[:MAX_EVIDENCE]


def _result(status: str, dry_run: bool) -> AuditResult | None:
    if status == "pending":
        return None  # not settled: its entry is written when it is
    if dry_run and status == "done":
        return AuditResult.DRY_RUN
    return _RESULTS.get(status, AuditResult.FAILED)


def record_actions(
    store: Store, action_ids: list[int], at: datetime | None = None
) -> list[AuditEntry]:
    """An entry for each of these actions that has settled, from its row in the actions table
    (kind, node, job, rule, reason, requested_by, status, outcome) and its node's open
    findings; returns the entries written. One read (the actions with their nodes' findings),
    one write."""
    if not action_ids:
        return []
    ids = set(action_ids)
    # the rows as the tick's reads and its own writes left them: no read of them again
    known = [r for i in sorted(ids) if (r := store.reads.known("actions", i)) is not None]
    if len(known) == len(ids):
        return record_rows(store, known, at)
    a, n = m.actions, m.nodes
    q = (
        select(a, n.c.open_findings)
        .select_from(a.outerjoin(n, n.c.name == a.c.node))
        .where(a.c.id.in_(sorted(action_ids)))
    )
    stamp = store.reads.mark(EVIDENCE_READS)
    with store.reading() as c:
        got = [(stored_action_row(r._mapping), r.open_findings) for r in c.execute(q)]
    found = {row.node: kept(f) for row, f in got if row.node}
    # a step auditing its own action on one of these nodes next needs no read
    store.reads.seed(stamp, {(EVIDENCE_KEY, n): f for n, f in found.items()})
    return _record_settled(store, [row for row, _ in got], found, at)


def record_rows(store: Store, rows: list[Recorded], at: datetime | None = None) -> list[AuditEntry]:
    """record_actions for rows the caller has just written, as written (not read back)."""
    return _record_settled(store, rows, evidence(store, [r.node for r in rows if r.node]), at)


def _record_settled(
    store: Store,
    rows: list[Recorded],
    found: dict[str, list[dict[str, Any]]],
    at: datetime | None,
) -> list[AuditEntry]:
    entries = []
    for r in rows:
        result = _result(r.status, r.dry_run)
        if result is None:
            continue
        entries.append(
            AuditEntry(
                kind=r.kind,
                actor=actor_of(r.requested_by),
                result=result,
                node=r.node,
                job_id=r.job_id,
                action_id=r.id,
                rule=r.rule,
                reason=r.reason,
                outcome=r.outcome,
                evidence=list(found.get(r.node, [])) if r.node else [],
                at=at or r.done_at or now(),
            )
        )
    record(store, *entries)
    return entries


def entries(
    store: Store,
    node: str | None = None,
    since: datetime | None = None,
    limit: int = 1000,
) -> list[AuditEntry]:
    """The log, newest first."""
    t = m.audit_log
    q = select(t).order_by(t.c.at.desc(), t.c.id.desc()).limit(limit)
    if node:
        q = q.where(t.c.node == node)
    if since:
        q = q.where(t.c.at >= since)
    with store.reading() as c:
        rows = [r._asdict() for r in c.execute(q)]
    return [
        AuditEntry(
            kind=r["kind"],
            actor=r["actor"],
            # only this module writes it; an unreadable word is not shown as success
            result=_RESULTS.get(r["result"], AuditResult.FAILED),
            node=r["node"],
            job_id=r["job_id"],
            action_id=r["action_id"],
            rule=r["rule"],
            reason=r["reason"],
            outcome=r["outcome"],
            evidence=list(r["evidence"] or []),
            at=aware(r["at"]) or now(),
            id=r["id"],
        )
        for r in rows
    ]


def prune(store: Store, cutoff: datetime, batch: int = 2000) -> int:
    """Delete up to `batch` of the oldest entries from before `cutoff`; returns how many."""
    t = m.audit_log
    with store.engine.begin() as c:
        ids = [r[0] for r in c.execute(select(t.c.id).where(t.c.at < cutoff).limit(batch))]
        if ids:
            c.execute(delete(t).where(t.c.id.in_(ids)))
    return len(ids)
