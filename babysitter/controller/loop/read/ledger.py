"""The lemon ledger: every rung babysitter climbed for a node (the `remediations` table), read
and written in typed rows. It survives controller restarts (it is the store) and a hostname
change (a GPU's UUID and serial are kept with each row, and a node's count includes the rows
of the GPUs it reports now). An admin's clear closes the node's episode and stops its rows
counting towards a lemon; the clear is a row of its own (who, when)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import and_, or_, select, update

from babysitter.controller.db import models as m
from babysitter.controller.db.row_patches import Patch, every, newest_first
from babysitter.controller.db.store import Store, aware
from babysitter.controller.loop.decide.ladder import Rung


class Phase(StrEnum):
    WAITING = "waiting"  # decided; waits for a reboot slot (the concurrency limit)
    REBOOTING = "rebooting"  # `scontrol reboot ASAP` issued; Slurm drains, then reboots
    RESETTING = "resetting"  # the agent was asked to reset a GPU
    VALIDATING = "validating"  # back; the validation job runs
    PASSED = "passed"  # validated and resumed
    FAILED = "failed"  # the rung did not heal it: the next rung follows
    TIMED_OUT = "timed_out"  # not back within reboot_timeout_s: paged, stays drained
    INSPECT = "inspect"  # stays drained for a human (inspect/rma rung, or no way to act)
    LEMON = "lemon"  # too many remediations in the window: stays drained for a human
    DRY_RUN = "dry_run"  # what would have happened
    CLEARED = "cleared"  # an admin cleared the node's ledger
    # someone else drained the node mid-episode: babysitter withdrew and lets go of it
    TAKEN_OVER = "taken_over"


ACTIVE = frozenset({Phase.WAITING, Phase.REBOOTING, Phase.RESETTING, Phase.VALIDATING})
# the node stays drained until an admin resumes it or clears the ledger (a dry-run row stays
# open as long as the dry-run drain, so it is written once)
AUTOMATIC = [r.value for r in Rung if r.automatic]
HELD = frozenset({Phase.FAILED, Phase.TIMED_OUT, Phase.INSPECT, Phase.LEMON, Phase.DRY_RUN})


@dataclass
class Remediation:
    id: int
    node: str
    rung: Rung
    fault_class: str
    fault: str
    state: Phase
    open: bool
    requested_by: str
    created_at: datetime
    updated_at: datetime
    outcome: str = ""
    gpu_uuid: str | None = None
    gpu_serial: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    done_at: datetime | None = None
    cleared_at: datetime | None = None

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> Remediation:
        return cls(
            id=int(r["id"]),
            node=r["node"],
            rung=Rung(r["rung"]),
            fault_class=r["fault_class"],
            fault=r["fault"],
            state=Phase(r["state"]),
            open=bool(r["open"]),
            requested_by=r["requested_by"],
            created_at=_at(r["created_at"]),
            updated_at=_at(r["updated_at"]),
            outcome=r["outcome"] or "",
            gpu_uuid=r["gpu_uuid"],
            gpu_serial=r["gpu_serial"],
            evidence=dict(r["evidence"] or {}),
            done_at=aware(r["done_at"]),
            cleared_at=aware(r["cleared_at"]),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: getattr(self, k)
            for k in (
                "id",
                "node",
                "fault_class",
                "fault",
                "open",
                "requested_by",
                "outcome",
                "gpu_uuid",
                "gpu_serial",
                "evidence",
            )
        }
        out["rung"] = self.rung.value
        out["state"] = self.state.value
        for k in ("created_at", "updated_at", "done_at", "cleared_at"):
            v = getattr(self, k)
            out[k] = v.isoformat() if v else None
        return out


@dataclass
class NewRow:
    """A ledger row to add (`Ledger.add_many`)."""

    node: str
    rung: Rung
    fault_class: str
    fault: str
    state: Phase
    requested_by: str = "policy"
    outcome: str = ""
    gpu_uuid: str | None = None
    gpu_serial: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def values(self, now: datetime) -> dict[str, Any]:
        return {
            "node": self.node,
            "rung": self.rung.value,
            "fault_class": self.fault_class[:128],
            "fault": self.fault,
            "gpu_uuid": self.gpu_uuid,
            "gpu_serial": self.gpu_serial,
            "state": self.state.value,
            "open": self.state in ACTIVE or self.state in HELD,
            "requested_by": self.requested_by,
            "outcome": self.outcome,
            "evidence": self.evidence,
            "created_at": now,
            "updated_at": now,
            "done_at": now if self.state not in ACTIVE else None,
        }


def carried_out(r: Remediation) -> bool:
    """The rung happened: a reboot Slurm was asked for, a reset ordered and not refused by the
    agent (one it never answered may have run: it counts). A rung that never ran (a refused
    reset, a reboot that could not be issued) is no remediation of the node."""
    if r.rung is Rung.REBOOT:
        return "issued_at" in r.evidence
    if r.rung is Rung.RESET_GPU:
        return "order_id" in r.evidence and not r.evidence.get("refused")
    return True


VIEW_KEY = ("remediations_view",)
_OPEN = datetime.max.replace(tzinfo=UTC)


def _kept_while(r: Remediation) -> datetime:
    """Until when a row of the view stays in it: an open row whatever its age, the others
    while created in the window."""
    return _OPEN if r.open else r.created_at


def _at(v: Any) -> datetime:
    out = aware(v)
    assert out is not None
    return out


# The tick's remembered reads of the ledger, kept current through the healer's own writes of
# it (issue 52, as db/action_view.py for the actions table): a row the healer inserts or moves,
# as it now is in the table, is placed where the read's own WHERE and ORDER BY would place it.
# A write that cannot say its rows (an admin's clear, the RMA step's link) leaves the reads
# stale and they are made again.
def as_written(rem: Remediation) -> Remediation:
    """A copy of the row as written: the step goes on changing its own object (and the
    evidence it carries) before its next write."""
    return dataclasses.replace(rem, evidence=dict(rem.evidence))


# the open rows; the view (`Ledger.view`): the open rows and those that may count towards a
# lemon (a closed row older than the window leaves it when next asked)
open_patch = every(lambda r: r.open)
view_patch = every(lambda r: r.open or (r.rung.automatic and r.cleared_at is None))


def history_patch(node: str | None, limit: int, since: datetime | None) -> Patch[Remediation]:
    """For the newest `limit` rows (of `node`, created since `since`), newest first."""
    return newest_first(
        limit,
        lambda r: (node is None or r.node == node) and (since is None or r.created_at >= since),
    )


class Ledger:
    def __init__(self, store: Store) -> None:
        self.store = store

    def add(
        self,
        node: str,
        rung: Rung,
        fault_class: str,
        fault: str,
        state: Phase,
        now: datetime,
        *,
        requested_by: str = "policy",
        outcome: str = "",
        gpu_uuid: str | None = None,
        gpu_serial: str | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> Remediation:
        """A new row, as written (its id included): the step that opened it goes on with it
        instead of reading back the row it has just written."""
        row = NewRow(
            node,
            rung,
            fault_class,
            fault,
            state,
            requested_by=requested_by,
            outcome=outcome,
            gpu_uuid=gpu_uuid,
            gpu_serial=gpu_serial,
            evidence=evidence or {},
        )
        return self.add_many([row], now)[0]

    def add_many(self, rows: list[NewRow], now: datetime) -> list[Remediation]:
        """New rows in one statement (a rack's episodes starting together), as written, in
        order."""
        if not rows:
            return []
        # the ids in the rows' order: PostgreSQL returns them so when asked; SQLite cannot be
        # asked, but one statement's new rowids ascend in the order its rows are inserted
        sqlite = self.store.engine.dialect.name == "sqlite"
        q = m.remediations.insert().returning(*m.remediations.c, sort_by_parameter_order=not sqlite)
        with self.store.reads.writing("remediations") as w, self.store.engine.begin() as c:
            got = [r._asdict() for r in c.execute(q, [r.values(now) for r in rows])]
            if sqlite:
                got.sort(key=lambda r: int(r["id"]))
            out = [Remediation.from_row(r) for r in got]
            for rem in out:
                w.add(as_written(rem))
        return out

    def move(
        self,
        rem: Remediation,
        state: Phase,
        now: datetime,
        outcome: str,
        **evidence: Any,
    ) -> None:
        """A remediation's next phase; `evidence` adds to what it carries."""
        rem.state, rem.outcome = state, outcome
        rem.evidence.update(evidence)
        values: dict[str, Any] = {
            "state": state.value,
            "outcome": outcome,
            "evidence": rem.evidence,
            "updated_at": now,
            "open": state in ACTIVE or state in HELD,
        }
        if state not in ACTIVE:
            values["done_at"] = now
        with self.store.reads.writing("remediations") as w, self.store.engine.begin() as c:
            c.execute(update(m.remediations).where(m.remediations.c.id == rem.id).values(values))
            w.add(
                as_written(
                    dataclasses.replace(
                        rem,
                        updated_at=now,
                        open=values["open"],
                        done_at=values.get("done_at", rem.done_at),
                    )
                )
            )

    def close(self, rem: Remediation, now: datetime, outcome: str) -> None:
        """The episode is over without a new phase (an admin resumed the node)."""
        done_at = rem.done_at or now
        with self.store.reads.writing("remediations") as w, self.store.engine.begin() as c:
            c.execute(
                update(m.remediations)
                .where(m.remediations.c.id == rem.id)
                .values(open=False, outcome=outcome, updated_at=now, done_at=done_at)
            )
            w.add(
                as_written(
                    dataclasses.replace(
                        rem, open=False, outcome=outcome, updated_at=now, done_at=done_at
                    )
                )
            )

    def open_rows(self) -> list[Remediation]:
        """The open rows (every node's current episode). Inside the tick, from its view of
        the ledger (`view`) once a step has read it."""
        seen = self.store.reads.remembered(("remediations",), VIEW_KEY)
        if seen is not None:
            return [dataclasses.replace(r) for r in seen[1] if r.open]

        def read() -> list[Remediation]:
            q = select(m.remediations).where(m.remediations.c.open.is_(True))
            with self.store.reading() as c:
                return [Remediation.from_row(r._asdict()) for r in c.execute(q)]

        # copies: a step changes its rows in memory before it writes them
        rows = self.store.reads.read(("remediations",), ("open_remediations",), read, open_patch)
        return [dataclasses.replace(r) for r in rows]

    def view(self, since: datetime) -> list[Remediation]:
        """What the healer reads of the ledger each tick, in one statement: the open rows
        and the rows that may count towards a lemon since `since` (automatic rungs, not
        cleared), oldest first. Its own writes keep it current (`view_patch`)."""

        def read(start: datetime) -> list[Remediation]:
            t = m.remediations.c
            countable = and_(t.rung.in_(AUTOMATIC), t.cleared_at.is_(None), t.created_at >= start)
            q = select(m.remediations).where(or_(t.open.is_(True), countable)).order_by(t.id)
            with self.store.reading() as c:
                return [Remediation.from_row(r._asdict()) for r in c.execute(q)]

        rows = self.store.reads.read_since(
            ("remediations",), VIEW_KEY, since, read, _kept_while, view_patch
        )
        return [dataclasses.replace(r) for r in rows]

    def history(
        self, node: str | None = None, limit: int = 200, since: datetime | None = None
    ) -> list[Remediation]:
        """Newest first; `since`: only those created then or later."""

        def read() -> list[Remediation]:  # built only when not remembered
            q = select(m.remediations).order_by(m.remediations.c.id.desc()).limit(limit)
            if node:
                q = q.where(m.remediations.c.node == node)
            if since is not None:
                q = q.where(m.remediations.c.created_at >= since)
            with self.store.reading() as c:
                return [Remediation.from_row(r._asdict()) for r in c.execute(q)]

        key = ("remediation_history", node, limit, since)
        patch = history_patch(node, limit, since)  # the healer's own writes keep it current
        rows = self.store.reads.read(("remediations",), key, read, patch)
        return [dataclasses.replace(r) for r in rows]

    def counted(self, node: str, gpus: Collection[str], since: datetime) -> list[Remediation]:
        """The remediations that count towards a lemon: automatic rungs actually carried out
        (`carried_out`) on this node or on one of its GPUs (by UUID or serial), not cleared,
        since `since`. Inside the tick one read serves every node that starts an episode."""
        excluded = (Phase.DRY_RUN, Phase.WAITING, Phase.TAKEN_OVER)
        return [
            r
            for r in self.view(since)
            if r.created_at >= since
            and r.rung.automatic
            and r.cleared_at is None
            and (r.node == node or r.gpu_uuid in gpus or r.gpu_serial in gpus)
            and r.state not in excluded
            and carried_out(r)
        ]

    def clear(self, node: str, who: str, now: datetime, why: str = "") -> int:
        """An admin's way back: the node's rows stop counting and its episode closes; the
        clear itself is recorded. Returns how many rows it cleared."""
        t = m.remediations.c
        with self.store.engine.begin() as c:
            n = c.execute(
                update(m.remediations)
                .where(t.node == node)
                .where(t.cleared_at.is_(None))
                .values(cleared_at=now, open=False, updated_at=now)
            ).rowcount
        self.add(
            node,
            Rung.INSPECT,
            "admin",
            why or "ledger cleared by an admin",
            Phase.CLEARED,
            now,
            requested_by=who,
            outcome=f"cleared {n} row(s)",
        )
        return int(n or 0)
