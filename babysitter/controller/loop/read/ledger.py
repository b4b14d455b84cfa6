"""The lemon ledger: every rung babysitter climbed for a node (the `remediations` table), read
and written in typed rows. It survives controller restarts (it is the store) and a hostname
change (a GPU's UUID and serial are kept with each row, and a node's count includes the rows
of the GPUs it reports now). An admin's clear closes the node's episode and stops its rows
counting towards a lemon; the clear is a row of its own (who, when)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import or_, select, update

from babysitter.controller.db import models as m
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


def carried_out(r: Remediation) -> bool:
    """The rung happened: a reboot Slurm was asked for, a reset ordered and not refused by the
    agent (one it never answered may have run: it counts). A rung that never ran (a refused
    reset, a reboot that could not be issued) is no remediation of the node."""
    if r.rung is Rung.REBOOT:
        return "issued_at" in r.evidence
    if r.rung is Rung.RESET_GPU:
        return "order_id" in r.evidence and not r.evidence.get("refused")
    return True


def _at(v: Any) -> datetime:
    out = aware(v)
    assert out is not None
    return out


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
        done = state not in ACTIVE
        with self.store.engine.begin() as c:
            row = c.execute(
                m.remediations.insert()
                .values(
                    node=node,
                    rung=rung.value,
                    fault_class=fault_class[:128],
                    fault=fault,
                    gpu_uuid=gpu_uuid,
                    gpu_serial=gpu_serial,
                    state=state.value,
                    open=state in ACTIVE or state in HELD,
                    requested_by=requested_by,
                    outcome=outcome,
                    evidence=evidence or {},
                    created_at=now,
                    updated_at=now,
                    done_at=now if done else None,
                )
                .returning(*m.remediations.c)
            ).one()
        return Remediation.from_row(row._asdict())

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
        with self.store.engine.begin() as c:
            c.execute(update(m.remediations).where(m.remediations.c.id == rem.id).values(values))

    def close(self, rem: Remediation, now: datetime, outcome: str) -> None:
        """The episode is over without a new phase (an admin resumed the node)."""
        with self.store.engine.begin() as c:
            c.execute(
                update(m.remediations)
                .where(m.remediations.c.id == rem.id)
                .values(open=False, outcome=outcome, updated_at=now, done_at=rem.done_at or now)
            )

    def open_rows(self) -> list[Remediation]:
        def read() -> list[Remediation]:
            q = select(m.remediations).where(m.remediations.c.open.is_(True))
            with self.store.reading() as c:
                return [Remediation.from_row(r._asdict()) for r in c.execute(q)]

        # copies: a step changes its rows in memory before it writes them
        rows = self.store.reads.read(("remediations",), ("open_remediations",), read)
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
        return [dataclasses.replace(r) for r in self.store.reads.read(("remediations",), key, read)]

    def counted(self, node: str, gpus: Collection[str], since: datetime) -> list[Remediation]:
        """The remediations that count towards a lemon: automatic rungs actually carried out
        (`carried_out`) on this node or on one of its GPUs (by UUID or serial), not cleared,
        since `since`."""
        t = m.remediations.c
        who = [t.node == node]
        if gpus:
            who += [t.gpu_uuid.in_(list(gpus)), t.gpu_serial.in_(list(gpus))]
        q = (
            select(m.remediations)
            .where(or_(*who))
            .where(t.rung.in_([r.value for r in Rung if r.automatic]))
            .where(
                t.state.notin_([Phase.DRY_RUN.value, Phase.WAITING.value, Phase.TAKEN_OVER.value])
            )
            .where(t.cleared_at.is_(None))
            .where(t.created_at >= since)
            .order_by(t.id)
        )
        with self.store.reading() as c:
            rows = [Remediation.from_row(r._asdict()) for r in c.execute(q)]
        return [r for r in rows if carried_out(r)]

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
