"""Maintenance windows: nodes an admin is working on. While a window is open babysitter neither
drains nor pages for its nodes; Slurm holds them in a MAINT reservation (no user job starts
there) and Alertmanager, where configured, silences alerts labelled with their names.

`start` opens a window (reservation, silence, audit entry); `end` closes it early; `expire`,
called every tick by the remediation loop, closes the windows whose deadline has passed. Each
step that could not be done (Slurm refused the reservation, Alertmanager unreachable) is kept
in the window's `note` and shown, never taken as done.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import httpx
from sqlalchemy import select, update

from babysitter.controller.db import audit
from babysitter.controller.db import models as m
from babysitter.controller.db.store import Store, aware, now
from babysitter.controller.loop.admit.gate import AdmittedSlurm
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Severity
from babysitter.slurm.client import SlurmClient, SlurmError

log = logging.getLogger(__name__)
RESERVATION_PREFIX = "babysitter_maint_"
AM_TIMEOUT_S = 5.0
MAINTENANCE_UNKNOWN = "maintenance_unknown"  # the alert while the windows cannot be read
LEFTOVER_KEY = "maintenance.reservations_to_delete"  # of ended windows, Slurm said no (yet)


def maintenance_unknown(now: datetime) -> Alert:
    return Alert(
        None,
        MAINTENANCE_UNKNOWN,
        Severity.CRITICAL,
        "maintenance windows cannot be read",
        "holding: nodes last known in maintenance stay quiet, no new automatic drain, "
        "reboot, reset or resume anywhere until the windows can be read",
        now,
    )


class WindowState(StrEnum):
    ACTIVE = "active"
    ENDED = "ended"


@dataclass(frozen=True)
class Window:
    id: int
    nodes: tuple[str, ...]
    hostlist: str
    reason: str
    created_by: str
    starts_at: datetime
    ends_at: datetime
    state: WindowState
    ended_at: datetime | None = None
    reservation: str | None = None
    silence_id: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "nodes": list(self.nodes),
            "hostlist": self.hostlist,
            "reason": self.reason,
            "created_by": self.created_by,
            "starts_at": self.starts_at.isoformat(),
            "ends_at": self.ends_at.isoformat(),
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "state": str(self.state),
            "reservation": self.reservation,
            "silence_id": self.silence_id,
            "notes": list(self.notes),
        }


def _window(r: dict[str, Any]) -> Window:
    return Window(
        id=int(r["id"]),
        nodes=tuple(r["nodes"] or ()),
        hostlist=r["hostlist"],
        reason=r["reason"],
        created_by=r["created_by"],
        starts_at=aware(r["starts_at"]) or now(),
        ends_at=aware(r["ends_at"]) or now(),
        # only this module writes it; anything else reads as active (the safer way: not paged
        # is visible on the page, a drain during maintenance is not undone)
        state=WindowState.ENDED if r["state"] == WindowState.ENDED else WindowState.ACTIVE,
        ended_at=aware(r["ended_at"]),
        reservation=r["reservation"],
        silence_id=r["silence_id"],
        notes=tuple(n for n in (r["note"] or "").split("\n") if n),
    )


def windows(store: Store, active_only: bool = True, limit: int = 200) -> list[Window]:

    def read() -> list[Window]:  # built only when not remembered
        t = m.maintenance_windows
        q = select(t).order_by(t.c.id.desc()).limit(limit)
        if active_only:
            q = q.where(t.c.state == WindowState.ACTIVE)
        with store.reading() as c:
            return [_window(r._asdict()) for r in c.execute(q)]

    return list(store.reads.read(("maintenance_windows",), ("windows", active_only, limit), read))


def nodes_in_maintenance(store: Store) -> dict[str, Window]:
    """node -> its open window (the latest, when several cover it)."""
    out: dict[str, Window] = {}
    for w in sorted(windows(store), key=lambda w: w.id):
        for n in w.nodes:
            out[n] = w
    return out


def reservation_name(window_id: int) -> str:
    return f"{RESERVATION_PREFIX}{window_id}"


class Alertmanager:
    """Silences through Alertmanager's v2 API (`POST /api/v2/silences`, `DELETE
    /api/v2/silence/ID`)."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url.rstrip("/")

    def silence(self, nodes: tuple[str, ...], until: datetime, by: str, comment: str) -> str:
        body = {
            "matchers": [
                {
                    "name": "node",
                    "value": "|".join(re.escape(n) for n in nodes),
                    "isRegex": True,
                    "isEqual": True,
                }
            ],
            "startsAt": now().isoformat(),
            "endsAt": until.isoformat(),
            "createdBy": by,
            "comment": comment,
        }
        r = httpx.post(f"{self.base}/api/v2/silences", json=body, timeout=AM_TIMEOUT_S)
        r.raise_for_status()
        return str(r.json()["silenceID"])

    def expire(self, silence_id: str) -> None:
        r = httpx.delete(f"{self.base}/api/v2/silence/{silence_id}", timeout=AM_TIMEOUT_S)
        if r.status_code != 404:  # already expired or deleted by someone: nothing to do
            r.raise_for_status()


class Maintenance:
    def __init__(
        self,
        store: Store,
        slurm: SlurmClient | None,
        alertmanager: Alertmanager | None,
        reservation_user: str = "root",
    ) -> None:
        self.store = store
        self.slurm = slurm
        self.am = alertmanager
        self.reservation_user = reservation_user
        self._last_quiet: set[str] = set()  # the nodes in a window at the last good read
        self.known = True  # False while the windows cannot be read

    def quiet_now(self, read: set[str] | None) -> set[str]:
        """The nodes to leave alone this tick: this tick's read, or when it failed (None) the
        last known set, never none (a failed read must not drain and page nodes an admin is
        working on). Whether a window opened since is unknown then: `known` is False, and the
        loop holds every new automatic action until a read succeeds."""
        if read is None:
            if self.known:
                log.error(
                    "maintenance windows unreadable: %d node(s) kept in maintenance as last "
                    "read, no new automatic action until they can be read",
                    len(self._last_quiet),
                )
            self.known = False
            return set(self._last_quiet)
        if not self.known:
            log.warning("maintenance windows readable again")
        self.known = True
        self._last_quiet = set(read)
        return set(read)

    def start(
        self, nodes: list[str], hostlist: str, until: datetime, reason: str, by: str
    ) -> Window:
        """Open a window: the row first (so the loop stops draining/paging at once), then the
        Slurm reservation and the Alertmanager silence, each noted if it failed."""
        t = m.maintenance_windows
        at = now()
        with self.store.engine.begin() as c:
            res = c.execute(
                t.insert().values(
                    nodes=sorted(set(nodes)),
                    hostlist=hostlist,
                    reason=reason,
                    created_by=by,
                    starts_at=at,
                    ends_at=until,
                    state=WindowState.ACTIVE,
                )
            )
            pk = res.inserted_primary_key
            assert pk is not None
            wid = int(pk[0])
        notes: list[str] = []
        reservation = None
        if self.slurm is None:
            notes.append("no Slurm reservation: this controller has no Slurm client")
        else:
            minutes = max(1, math.ceil((until - at).total_seconds() / 60))
            try:
                AdmittedSlurm(self.slurm).reserve_maintenance(
                    reservation_name(wid), sorted(set(nodes)), self.reservation_user, minutes
                )
                reservation = reservation_name(wid)
            except SlurmError as exc:
                notes.append(f"Slurm reservation failed: {exc}")
        silence = None
        if self.am is not None:
            try:
                silence = self.am.silence(
                    tuple(sorted(set(nodes))), until, by, f"babysitter maintenance: {reason}"
                )
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                notes.append(f"Alertmanager silence failed: {exc}")
        with self.store.engine.begin() as c:
            c.execute(
                update(t)
                .where(t.c.id == wid)
                .values(reservation=reservation, silence_id=silence, note="\n".join(notes) or None)
            )
        self._audit("maintenance_start", wid, nodes, by, reason, notes, at)
        w = self.get(wid)
        assert w is not None
        return w

    def get(self, wid: int) -> Window | None:
        t = m.maintenance_windows
        with self.store.reading() as c:
            r = c.execute(select(t).where(t.c.id == wid)).first()
        return _window(r._asdict()) if r else None

    def end(self, nodes: list[str], by: str) -> list[Window]:
        """End maintenance for `nodes`: each open window covering any of them lets go of those
        nodes only (its reservation and silence shrink to the others) and ends when none is
        left. Returns the windows it changed."""
        wanted = set(nodes)
        out = []
        for w in windows(self.store):
            if not wanted & set(w.nodes):
                continue
            rest = [n for n in w.nodes if n not in wanted]
            if rest:
                out.append(self._shrink(w, rest, by))
            else:
                out.append(self._close(w, by, "ended by an admin"))
        return out

    def _shrink(self, w: Window, rest: list[str], by: str) -> Window:
        """`w` without the nodes not in `rest`: those leave its reservation and its silence."""
        gone = sorted(set(w.nodes) - set(rest))
        notes: list[str] = []
        if w.reservation and self.slurm is not None:
            try:
                AdmittedSlurm(self.slurm).shrink_hold(w.reservation, rest)
            except SlurmError as exc:
                notes.append(f"{', '.join(gone)} still in reservation {w.reservation}: {exc}")
        silence = w.silence_id
        if silence and self.am is not None:
            try:
                self.am.expire(silence)
                silence = self.am.silence(
                    tuple(rest), w.ends_at, by, f"babysitter maintenance: {w.reason}"
                )
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                notes.append(f"could not narrow silence {silence}: {exc}")
        t = m.maintenance_windows
        with self.store.engine.begin() as c:
            c.execute(
                update(t)
                .where(t.c.id == w.id)
                .values(
                    nodes=rest,
                    silence_id=silence,
                    note="\n".join([*w.notes, f"{', '.join(gone)} ended early by {by}", *notes]),
                )
            )
        self._audit("maintenance_end", w.id, gone, by, "ended by an admin", notes, now())
        shrunk = self.get(w.id)
        assert shrunk is not None
        return shrunk

    def expire(self, at: datetime | None = None) -> list[Window]:
        """Close the windows whose deadline has passed (called every tick, one read when
        none has); returns the windows still open."""
        at = at or now()
        self._retry_leftovers()
        still = []
        for w in windows(self.store):
            if w.ends_at <= at:
                self._close(w, audit.Actor.MAINTENANCE, "deadline reached")
            else:
                still.append(w)
        return still

    def _retry_leftovers(self) -> None:
        """Reservations of ended windows Slurm did not delete: asked again every tick until
        they are gone (an ended window leaves no reservation behind)."""
        left = self.store.kv_get(LEFTOVER_KEY) or []
        if not left or self.slurm is None:
            return
        still = []
        for name in left:
            try:
                AdmittedSlurm(self.slurm).end_maintenance(name)
                log.info("maintenance reservation %s deleted at last", name)
            except SlurmError:
                still.append(name)
        if still != left:
            self.store.kv_set(LEFTOVER_KEY, still)

    def _close(self, w: Window, by: str, why: str) -> Window:
        notes: list[str] = []
        if w.reservation and self.slurm is not None:
            try:
                AdmittedSlurm(self.slurm).end_maintenance(w.reservation)
            except SlurmError as exc:
                notes.append(f"could not delete reservation {w.reservation} yet: {exc}")
                left = self.store.kv_get(LEFTOVER_KEY) or []
                self.store.kv_set(LEFTOVER_KEY, sorted({*left, w.reservation}))
        if w.silence_id and self.am is not None:
            try:
                self.am.expire(w.silence_id)
            except httpx.HTTPError as exc:
                notes.append(f"could not expire silence {w.silence_id}: {exc}")
        at = now()
        t = m.maintenance_windows
        with self.store.engine.begin() as c:
            c.execute(
                update(t)
                .where(t.c.id == w.id)
                .values(
                    state=WindowState.ENDED,
                    ended_at=at,
                    note="\n".join([*w.notes, *notes]) or None,
                )
            )
        self._audit("maintenance_end", w.id, list(w.nodes), by, why, notes, at)
        closed = self.get(w.id)
        assert closed is not None
        return closed

    def _audit(
        self,
        kind: str,
        wid: int,
        nodes: list[str],
        by: str,
        reason: str,
        notes: list[str],
        at: datetime,
    ) -> None:
        result = audit.AuditResult.FAILED if notes else audit.AuditResult.DONE
        audit.record(
            self.store,
            *(
                audit.AuditEntry(
                    kind=kind,
                    actor=by,
                    result=result,
                    node=n,
                    rule="maintenance",
                    reason=reason,
                    outcome=f"window {wid}" + (": " + "; ".join(notes) if notes else ""),
                    at=at,
                )
                for n in sorted(set(nodes))
            ),
        )
