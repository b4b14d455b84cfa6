"""RMA evidence, the controller's side: when a node becomes a lemon, or a reset / reboot rung
fails, order an evidence archive from the node's agent (agent/rma.py: `nvidia-bug-report.sh`
output and the recent kernel log), and page with its link once it is stored
(controller/loop/heal/rma_archive.py builds it from the upload, with the ledger and findings).

It reads the ledger the healer writes (no hook in the healer: a lemon row, or a failed
reset / reboot row, is the trigger), so it never holds up a rung. Collection is an action of
kind `rma_evidence` (running -> done | failed); no upload within `[rma] collect_timeout_s` is a
failed collection, alerted (`rma_evidence`, warning), never dropped."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from babysitter.config import Config
from babysitter.controller.db import audit
from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store, aware
from babysitter.controller.loop.admit.order_permission import order_rma
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.read.ledger import Ledger, Phase, Remediation
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Severity

log = logging.getLogger(__name__)

CONDITION = "rma_evidence"
ORDER = "rma.collect"  # the agent's agent/rma.py ORDER
ORDERED, COLLECTED, FAILED = "ordered", "collected", "failed"
LOOKBACK = timedelta(days=1)  # older ledger rows never order one (an upgrade's history)
FAILED_RUNGS = (Rung.RESET_GPU, Rung.REBOOT)


@dataclass(frozen=True)
class Archive:
    id: int
    node: str
    ledger_id: int | None
    trigger: str
    order_id: str
    action_id: int | None
    state: str
    outcome: str | None
    path: str | None
    size: int | None
    sha256: str | None
    alerted: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> Archive:
        r = dict(r)
        r["created_at"], r["updated_at"] = aware(r["created_at"]), aware(r["updated_at"])
        return cls(**r)

    def url(self, base: str | None = None) -> str:
        """Where it is downloaded (read or admin token)."""
        return f"{(base or '').rstrip('/')}/api/v1/rma/{self.id}/archive"

    def to_json(self, base: str | None = None) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["created_at"], d["updated_at"] = self.created_at.isoformat(), self.updated_at.isoformat()
        d["url"] = self.url(base) if self.state == COLLECTED else None
        return d


def archives(
    store: Store, node: str | None = None, state: str | None = None, limit: int = 50
) -> list[Archive]:
    """Newest first."""

    def read() -> list[Archive]:  # built only when not remembered
        t = m.rma_archives
        q = select(t).order_by(t.c.id.desc()).limit(limit)
        if node:
            q = q.where(t.c.node == node)
        if state:
            q = q.where(t.c.state == state)
        with store.reading() as c:
            return [Archive.from_row(r._asdict()) for r in c.execute(q)]

    return list(store.reads.read(("rma_archives",), ("rma_archives", node, state, limit), read))


def archive(
    store: Store, archive_id: int | None = None, order: str | None = None
) -> Archive | None:
    t = m.rma_archives
    q = (
        select(t).where(t.c.id == archive_id)
        if archive_id
        else select(t).where(t.c.order_id == order)
    )
    with store.reading() as c:
        row = c.execute(q).first()
    return Archive.from_row(row._asdict()) if row else None


def set_archive(store: Store, archive_id: int, **values: Any) -> None:
    with store.engine.begin() as c:
        c.execute(update(m.rma_archives).where(m.rma_archives.c.id == archive_id).values(**values))


def trigger_of(r: Remediation) -> str | None:
    """Why this ledger row asks for RMA evidence (None: it does not)."""
    if r.state is Phase.LEMON:
        return f"lemon: {r.evidence.get('lemon') or r.fault}"[:500]
    if r.state is Phase.FAILED and r.rung in FAILED_RUNGS and not r.evidence.get("refused"):
        return f"{r.rung.value} failed: {r.outcome or r.fault}"[:500]
    return None


class RmaEvidence:
    def __init__(self, cfg: Config, store: Store) -> None:
        self.cfg = cfg.rma
        self.base = cfg.controller.public_url
        self.prefix = cfg.slurm.reason_prefix
        self.store = store
        self.ledger = Ledger(store)

    def step(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        if not self.cfg.enabled:
            return
        # never for a node in maintenance or under someone else's reason (order_permission.py):
        # asked again each tick, ordered once the node is back to babysitter's episode
        for row, why in self._triggers(now):
            if (held := order_rma(self.store, self.prefix, row, why, now, ORDERED)) is not None:
                log.debug("%s: RMA evidence not ordered: %s", row.node, held)
            else:
                log.warning("%s: RMA evidence ordered (%s)", row.node, why)
        for a in archives(self.store, state=ORDERED, limit=500):
            waited = (now - a.created_at).total_seconds()
            if waited > self.cfg.collect_timeout_s:
                self.fail(a, now, f"the agent sent nothing within {self.cfg.collect_timeout_s:g} s")
        for a in archives(self.store, limit=500)[:200]:  # the read _triggers made
            if a.state != ORDERED and not a.alerted:
                firing.append(self._alert(a, now))
                set_archive(self.store, a.id, alerted=True)
                self._link(a)
        clearing += [(node, CONDITION) for node in self._back()]

    def _triggers(self, now: datetime) -> list[tuple[Remediation, str]]:
        """Ledger rows asking for evidence, newer than their node's latest archive."""
        latest: dict[str, datetime] = {}
        for a in archives(self.store, limit=500):
            latest.setdefault(a.node, a.created_at)
        out = []
        for r in self.ledger.history(limit=200):
            why = trigger_of(r)
            if why is None or r.updated_at < now - LOOKBACK:
                continue
            if r.node in latest and latest[r.node] >= r.updated_at:
                continue  # an archive taken since covers it
            latest[r.node] = now  # one archive per node per tick
            out.append((r, why))
        return out

    def fail(self, a: Archive, now: datetime, why: str) -> None:
        set_archive(self.store, a.id, state=FAILED, outcome=why, updated_at=now)
        if a.action_id:
            self.store.update_action(a.action_id, status="failed", done_at=now, outcome=why)
            audit.record_actions(self.store, [a.action_id], now)
        log.warning("%s: RMA evidence not collected: %s", a.node, why)

    def _alert(self, a: Archive, now: datetime) -> Alert:
        if a.state == COLLECTED:
            return Alert(
                a.node,
                CONDITION,
                Severity.INFO,
                f"{a.node}: RMA evidence collected ({a.trigger}): {a.url(self.base)}",
                f"archive {a.path} stored ({a.outcome})",
                now,
                details={"url": a.url(self.base), "archive_id": a.id, "trigger": a.trigger},
            )
        return Alert(
            a.node,
            CONDITION,
            Severity.WARNING,
            f"{a.node}: RMA evidence could not be collected ({a.trigger}): {a.outcome}",
            "no archive: collect nvidia-bug-report.sh and the kernel log by hand",
            now,
            details={"archive_id": a.id, "trigger": a.trigger},
        )

    def _link(self, a: Archive) -> None:
        """The lemon's ledger row names its archive (the lemon alert links it)."""
        if a.state != COLLECTED or a.ledger_id is None:
            return
        t = m.remediations
        with self.store.engine.begin() as c:
            ev = c.execute(select(t.c.evidence).where(t.c.id == a.ledger_id)).scalar()
            if ev is None:
                return
            ev = {**ev, "rma_archive": a.url(self.base)}
            c.execute(update(t).where(t.c.id == a.ledger_id).values(evidence=ev))

    def _back(self) -> list[str]:
        """Nodes with a firing rma_evidence alert that are back in service: the notice is
        over (one read of the alerts a tick; the nodes only while one fires)."""
        nodes = {
            a["node"]
            for a in self.store.firing_alerts()
            if a["condition"] == CONDITION and a["node"]
        }
        if not nodes:
            return []
        held = {r.node for r in self.ledger.open_rows()}
        return [
            n
            for n in sorted(nodes - held)
            if not (self.store.node(n) or {}).get("babysitter_drained", True)
        ]
