"""The periodic SDC test, on by default, without ever touching a job (docs/checks.md,
"Periodic SDC tests").

Every node is tested every `[checks.sdc] interval_s`, only while it is idle, under a short
babysitter-owned Slurm hold:

1. From a fresh node listing, pick due nodes that Slurm shows IDLE with no flag (no job, not
   drained, not reserved, responding) and whose agent reports; the ones tested longest ago
   first, while fewer than `max_concurrent` are under test cluster-wide.
2. Hold them: one reservation for the batch (`babysitter_sdc_...`), created *without*
   IGNORE_JOBS, so slurmctld itself refuses it if a job got any of them since the listing
   (then the batch is split and retried). From then on Slurm starts no job there; a user job
   sent to such a node waits until the hold ends. The reservation ends by itself after
   `hold_s` even if the controller dies.
3. Order the test: the order (an id per node) is in the database; the ingest hands it to the
   node's agent in its answer to the next report (controller/api/orders.py). The agent asks NVML
   once more that no GPU is in use (fail closed) and runs the test, then reports at once.
4. Collect: the node's report metrics name the order it answered (or say why it did not run);
   no answer within `result_timeout_s` releases the node untested, saying so.
5. Release: nodes done go back to Slurm (the reservation shrinks, or is deleted with its last
   node).

Slurm cost: one RPC per batch created, one per shrink/delete, one listing of reservations at
start; all drawn from a token bucket of `max_slurm_rpc_per_s` (default 0.2/s, a tenth of the
2 RPC/s budget at 10,000 nodes). A failing test is an ordinary critical finding of the node:
the policy drains it and validation/the ladder take over from there.

Which nodes are due and may be tested is sdc_due.py's (pure); the schedule's table is
sdc_store.py's.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import String, bindparam, cast, select

from babysitter.controller.db import audit
from babysitter.controller.db import models as m
from babysitter.controller.db.audit import Actor, AuditEntry, AuditResult
from babysitter.controller.loop.admit.gate import AdmittedSlurm
from babysitter.controller.loop.read.context import LoopContext
from babysitter.controller.loop.sdc.due import NodeSchedule, due_nodes
from babysitter.controller.loop.sdc.store import load_rows, save_rows
from babysitter.finding import Severity
from babysitter.slurm.client import SlurmBusy, SlurmError

log = logging.getLogger(__name__)

CHECK = "sdc.matmul"
RULE = "sdc_periodic"  # the audit log's rule for the schedule's holds
HOLD_PREFIX = "babysitter_sdc_"
BURST = 5  # Slurm calls the schedule may make back to back
AGENTS_TTL = timedelta(seconds=15)  # see SdcScheduler._agents
READY_KEY = "sdc_ready"  # in an agent's report metrics: it runs sdc.matmul when ordered
# each node's name, whether its agent runs the SDC check, reports, and has a critical finding:
# one statement, built once (it was three, built on every read)
_AGENTS = select(
    m.nodes.c.name,
    cast(m.nodes.c.metrics, String).like(f'%"{READY_KEY}"%'),
    m.nodes.c.last_report_at >= bindparam("stale"),
    m.nodes.c.worst_severity == str(Severity.CRITICAL),
).order_by(m.nodes.c.name)


class TokenBucket:
    """At most `rate` calls per second on average, `burst` at once."""

    def __init__(
        self, rate: float, burst: int = BURST, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate, self.burst = rate, float(burst)
        self.clock = clock
        self.tokens = float(burst)
        self.at = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class _Hold:
    nodes: set[str]  # still held
    done: set[str] = field(default_factory=set)  # answered or given up: to release


class SdcScheduler:
    def __init__(self, ctx: LoopContext, clock: Callable[[], float] = time.monotonic) -> None:
        cfg, store, slurm, snapshot = ctx.cfg, ctx.store, ctx.slurm, ctx.snapshot
        self.cfg = cfg.checks.sdc
        self.enabled = self.cfg.enabled
        self.user = cfg.validation.user
        self.heartbeat_s = cfg.controller.heartbeat_timeout_s
        self.prefix = cfg.slurm.reason_prefix
        self.store = store
        self.slurm = slurm
        self.snapshot = snapshot
        self.rpc = TokenBucket(self.cfg.max_slurm_rpc_per_s, clock=clock)
        self.rows: dict[str, NodeSchedule] = {}
        self.holds: dict[str, _Hold] = {}
        self._recovered = False
        self._listing_seen = -1.0  # snapshot.read_at of the last listing planned on
        self._retry: list[list[str]] = []  # halves of a batch Slurm refused as busy
        self._seq = 0
        self._agents_cache: tuple[datetime, dict[str, str]] | None = None
        self._warned = False

    # ---- the tick
    def tick(self, now: datetime | None = None) -> None:
        if not self.enabled or not self.snapshot.ok:
            return  # every step needs Slurm: nothing to do while it cannot be read
        now = now or datetime.now(UTC)
        if not self._recovered and not self._recover(now):
            return
        self._collect(now)
        self._release()
        if self.snapshot.ok and self.snapshot.read_at != self._listing_seen:
            self._listing_seen = self.snapshot.read_at
            self._start(now)

    @property
    def testing(self) -> int:
        return sum(len(h.nodes) for h in self.holds.values())

    # ---- restart: the database and Slurm's reservations are the state
    def _recover(self, now: datetime) -> bool:
        """Load the schedule and reconcile it with the holds Slurm has (a controller that
        restarted mid-test): holds we still track go on, unknown ones are deleted, orders
        whose hold is gone are closed."""
        if not self.rpc.take():
            return False
        try:
            in_slurm = self.slurm.holds(HOLD_PREFIX)
        except NotImplementedError:
            log.warning("SDC schedule off: this Slurm client cannot hold nodes")
            self.enabled = False
            return False
        except SlurmError as exc:
            (log.debug if self._warned else log.warning)(
                "SDC schedule waits: cannot list Slurm reservations: %s", exc
            )
            self._warned = True
            return False
        self.rows.update(load_rows(self.store))
        changed = []
        for row in self.rows.values():
            if row.hold and row.hold in in_slurm and row.node in in_slurm[row.hold]:
                self.holds.setdefault(row.hold, _Hold(set())).nodes.add(row.node)
            elif row.hold or row.order_id:
                row.hold = row.order_id = None
                changed.append(row)
        for name in in_slurm.keys() - self.holds.keys():
            log.info("SDC schedule: deleting leftover hold %s", name)
            self.holds[name] = _Hold(set())  # released below, within the RPC budget
        self._save(changed, now)
        self._recovered = True
        return True

    # ---- results
    def _collect(self, now: datetime) -> None:
        ordered = {r.node: r for r in self.rows.values() if r.order_id}
        if not ordered:
            return
        with self.store.engine.connect() as c:
            q = select(m.nodes.c.name, m.nodes.c.metrics).where(m.nodes.c.name.in_(sorted(ordered)))
            metrics: dict[str, Any] = {name: v for name, v in c.execute(q)}
        changed = []
        for node, row in ordered.items():
            got = _answer(metrics.get(node), row.order_id or "")
            if got is None:
                age = (now - row.ordered_at).total_seconds() if row.ordered_at else 0.0
                if age < self.cfg.result_timeout_s:
                    continue
                got = {
                    "ran": False,
                    "message": f"SDC test not run: no answer from the agent within "
                    f"{self.cfg.result_timeout_s:g} s of the order (agent down or stuck?)",
                }
            self._done(row, got, now)
            changed.append(row)
        self._save(changed, now)

    def _done(self, row: NodeSchedule, got: dict[str, Any], now: datetime) -> None:
        if got.get("ran"):
            finished = _time(got.get("finished_at")) or now
            row.last_run_at = min(finished, now)
            row.last_code = str(got.get("code") or "")[:64]
            row.last_library = str(got.get("library") or "")[:64] or None
            row.last_message = str(got.get("message") or "")[:500]
            gflops = got.get("gflops")
            row.last_gflops = (
                {str(k)[:32]: float(v) for k, v in list(gflops.items())[:64]}
                if isinstance(gflops, dict)
                else None
            )
            row.waiting = None
            log.info("%s: SDC test done: %s", row.node, row.last_message)
        else:
            row.waiting = str(got.get("message") or got.get("why") or "not run")[:500]
            log.info("%s: %s", row.node, row.waiting)
        if row.hold in self.holds:
            self.holds[row.hold].done.add(row.node)
        row.order_id = None
        row.last_attempt_at = now

    # ---- give nodes back to Slurm
    def _release(self) -> None:
        for name, h in list(self.holds.items()):
            if not h.done and h.nodes:
                continue
            if not self.rpc.take():
                return  # the hold ends by itself at hold_s at the latest
            keep = h.nodes - h.done
            try:
                if keep:
                    AdmittedSlurm(self.slurm).shrink_hold(name, sorted(keep))
                else:
                    AdmittedSlurm(self.slurm).release_hold(name)
            except SlurmError as exc:
                log.warning("SDC schedule: could not release %s: %s", name, exc)
                continue
            self._audit(
                "sdc_release",
                AuditResult.DONE,
                f"SDC test over on {','.join(sorted(h.done)) or 'no node'}",
                f"Slurm reservation {name} " + ("shrunk" if keep else "deleted"),
                None,
            )
            for node in h.done:
                if (r := self.rows.get(node)) is not None and r.hold == name:
                    r.hold = None
            self._save([self.rows[n] for n in h.done if n in self.rows], None)
            if keep:
                self.holds[name] = _Hold(keep)
            else:
                del self.holds[name]

    # ---- start tests
    def _start(self, now: datetime) -> None:
        eligible, why = self._eligible(now)
        room = self.cfg.max_concurrent - self.testing
        chosen: list[str] = []
        while self._retry and not chosen:  # parts of a batch Slurm refused, first
            ok = set(eligible)
            chosen = [n for n in self._retry.pop(0) if n in ok][: max(0, room)]
        if not chosen:
            chosen = eligible[: max(0, room)]
        for node in eligible:
            if node not in chosen:
                why[node] = (
                    f"due, waiting for a slot (at most {self.cfg.max_concurrent} nodes under "
                    "test at once, cluster-wide)"
                )
        if chosen and not self.rpc.take():
            for node in chosen:
                why[node] = "due, waiting for the Slurm call budget"
            chosen = []
        if chosen:
            self._hold(chosen, now, why)
        self._note(why, now)

    def _eligible(self, now: datetime) -> tuple[list[str], dict[str, str]]:
        """Due nodes that may be tested now (longest untested first), and why each other due
        node may not (sdc_due.py)."""
        held = {n for h in self.holds.values() for n in h.nodes}
        return due_nodes(
            self.rows,
            self.snapshot.nodes,
            held,
            self._agents(now),
            self.cfg.interval_s,
            self.prefix,
            now,
        )

    def _agents(self, now: datetime) -> dict[str, str]:
        """Per node with a row: "" when its agent reports, runs the SDC check (says so in
        its metrics: an older agent, or one with the check off, is never held for nothing)
        and has no open critical finding; else why the node is not tested. Re-read at most
        every AGENTS_TTL (names only; liveness is judged on a 120 s heartbeat anyway)."""
        if self._agents_cache is not None and now - self._agents_cache[0] < AGENTS_TTL:
            return self._agents_cache[1]
        stale = now - timedelta(seconds=self.heartbeat_s)
        with self.store.reading() as c:
            rows = c.execute(_AGENTS, {"stale": stale}).all()
        known = [name for name, _, _, _ in rows]
        fresh = {name: bool(can) for name, can, recent, _ in rows if recent}
        critical = {name for name, _, _, bad in rows if bad}
        out = dict.fromkeys(known, "its agent is not reporting")
        for name, can in fresh.items():
            if not can:
                out[name] = "its agent does not run the SDC check (turned off there, or too old)"
            elif name in critical:
                out[name] = "open critical findings: the node is being handled"
            else:
                out[name] = ""
        self._agents_cache = (now, out)
        return out

    def _hold(self, nodes: list[str], now: datetime, why: dict[str, str]) -> None:
        self._seq += 1
        name = f"{HOLD_PREFIX}{int(now.timestamp())}_{self._seq}"
        minutes = max(1, math.ceil(self.cfg.hold_s / 60))
        try:
            AdmittedSlurm(self.slurm).hold_idle(name, nodes, self.user, minutes)
        except SlurmBusy:
            # a job got one of them since the listing: the halves are tried on the next
            # listings (which will mostly show the job anyway); a node refused alone waits
            self._audit(
                "sdc_hold",
                AuditResult.SKIPPED,
                f"due for the periodic SDC test: {','.join(nodes)}",
                "Slurm refused the hold: a job started on one of them",
                now,
            )
            if len(nodes) > 1:
                half = len(nodes) // 2
                self._retry[:0] = [nodes[:half], nodes[half:]]
            else:
                row = self.rows.setdefault(nodes[0], NodeSchedule(nodes[0]))
                row.last_attempt_at = now
            for n in nodes:
                why[n] = "Slurm refused the hold: a job started there"
            return
        except SlurmError as exc:
            log.warning("SDC schedule: could not hold %s: %s", ",".join(nodes), exc)
            for n in nodes:
                why[n] = f"could not hold the node in Slurm: {exc}"[:500]
            return
        self.holds[name] = _Hold(set(nodes))
        self._audit(
            "sdc_hold",
            AuditResult.DONE,
            f"due for the periodic SDC test: {','.join(nodes)}",
            f"Slurm reservation {name}: no job starts there until the test is over "
            f"(ends by itself after {minutes} min)",
            now,
        )
        rows = []
        for n in nodes:
            row = self.rows.setdefault(n, NodeSchedule(n))
            row.hold, row.order_id, row.ordered_at = name, str(uuid.uuid4()), now
            row.waiting = None
            rows.append(row)
        self._save(rows, now)
        log.info("SDC schedule: %s holds %s; test ordered", name, ",".join(nodes))

    def _note(self, why: dict[str, str], now: datetime) -> None:
        """Record why due nodes are not tested (written only when it changes)."""
        changed = []
        for node, reason in why.items():
            row = self.rows.get(node)
            if row is None:
                row = self.rows[node] = NodeSchedule(node)
            elif row.waiting == reason:
                continue
            row.waiting = reason
            changed.append(row)
        self._save(changed, now)

    def _audit(
        self, kind: str, result: AuditResult, reason: str, outcome: str, at: datetime | None
    ) -> None:
        """One audit entry per batch (not per node: 10,000 nodes every 4 h would be ~120,000
        entries a day); the nodes are named in the reason."""
        audit.record(
            self.store,
            AuditEntry(
                kind=kind,
                actor=Actor.SDC,
                result=result,
                rule=RULE,
                reason=reason,
                outcome=outcome,
                at=at or datetime.now(UTC),
            ),
        )

    # ---- storage (sdc_store.py)
    def _save(self, rows: Iterable[NodeSchedule], now: datetime | None) -> None:
        save_rows(self.store, rows, now)


def _answer(metrics: Any, order: str) -> dict[str, Any] | None:
    """What the node's report metrics say about `order`: its SDC run (metrics.sdc) or its
    refusal (metrics.order_refused); None while they say nothing about it. A node speaks only
    for itself and may send anything: only plain values are taken."""
    if not isinstance(metrics, dict) or not order:
        return None
    sdc = metrics.get("sdc")
    if isinstance(sdc, dict) and sdc.get("order") == order:
        return sdc
    refused = metrics.get("order_refused")
    if isinstance(refused, dict) and refused.get("order") == order:
        return {"ran": False, "message": f"order refused by the agent: {refused.get('why')}"}
    return None


def _time(v: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(v), UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
