"""A babysat job whose own NCCL reported a network failure is requeued at once, from its last
checkpoint, whether it still runs or has just died of it (FAILED, NODE_FAIL).

Why: a port that goes down is held for `checks.infiniband.port_down_hold_s` (NCCL's IB retry
budget) before its node drains, and an outage on the far end never drains this node at all.
NCCL may give up first: the job's log then shows the failure and the job dies, with no drain to
requeue it. Its own log line is evidence about the job (finding.job_owned), so it acts on the
job only: never a drain, a resume or any other change of a node, never fabric evidence (the
policy, fabric.py and link_hold.critical ignore it). The requeue excludes only the job's nodes
whose *own* findings show a link problem now (a port down within its hold, a flapping port).

Link class: `nccl.transport_error` (an IB work completion with an error status, a fatal async
event, OFI completions in error) and `nccl.remote_error` (ncclRemoteError: a peer's process or
the network went away). Not: `nccl.watchdog_timeout` and `nccl.pg_timeout`, a collective that
did not finish in time, which is what any stall looks like (a rank hung in user code, a data
loader, an imbalance, a slow file system; bench/soak.py injects them as a user's benign noise).
When the network is the cause, NCCL's transport names it too, and that line requeues. Nor
`nccl.unhandled_system_error` (also /dev/shm, file and other system call failures).

One failure, one requeue: a line already handled for the job (its history has it) is never
acted on again, whichever report or node carries it (every node of a job reads the shared
`slurm-<id>.out`; an agent restart or the job's next node reads an appended log from the
start). A failure reported within STALE_S of the job's last requeue may be the previous run's
last words (a line printed before the requeue is read up to a check interval later): recorded,
not requeued. The requeue itself is an action in the jobs' pending/retry pipeline
(JobTracker.record_requeue, executed by execute_requeue with `failed_ok`), counted against the
job's max_requeues like any other.

A job that ended is requeued only while slurmctld still holds its record: `scontrol requeue`
takes a finished batch job back to PENDING, but only until MinJobAge (slurm.conf, 300 s by
default) purges it; then Slurm answers "Invalid job id" and there is nothing to requeue. This
runs every tick on the open findings the tick read already (controller/loop/read/facts.py), so a
job that just failed is requeued seconds after its node reported the line."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from babysitter.controller.db.store import HistoryEntry, JobRow
from babysitter.controller.loop.decide.link_hold import LINK_CODES, JobPhase, job_phase
from babysitter.controller.loop.decide.node.facts_model import NodeFacts
from babysitter.controller.loop.jobs.job_policy import JobDecision, babysit_spec
from babysitter.controller.loop.jobs.jobs import NCCL_RULE, JobTracker
from babysitter.finding import Finding, Severity, job_of, job_owned
from babysitter.slurm.client import SlurmError, SlurmNotFound

log = logging.getLogger(__name__)

NETWORK_CODES = frozenset({"nccl.transport_error", "nccl.remote_error"})
# a node whose own port shows this is kept out of the requeued job (its own evidence)
NODE_LINK_CODES = LINK_CODES | {"ib.port_flapping"}
# the job-log check reads every 30 s with a 20 s timeout (checks/nccl/check.py): a line printed
# before a requeue reaches the controller within about this long
STALE_S = 60.0
EVENT = "nccl_failure"
SEEN_MAX = 10_000  # (job, line) pairs remembered in memory; the job's history is the record


@dataclass(frozen=True)
class NcclFailure:
    job_id: int
    code: str
    line: str  # the job's log line (the finding's message without "job <id> on <node>: ")
    nodes: tuple[str, ...]  # the nodes whose reports carry it


def log_line(f: Finding) -> str:
    """The job's own line: the same on every node that read the shared log."""
    head, sep, rest = f.message.partition(": ")
    return rest if sep and head.startswith("job ") and " on " in head else f.message


def network_failures(facts: Iterable[NodeFacts]) -> dict[int, NcclFailure]:
    """Per job, the first NCCL network failure its own log reported (nodes in name order)."""
    out: dict[int, NcclFailure] = {}
    for n in sorted(facts, key=lambda n: n.name):
        for f in n.open_findings:
            if f.code not in NETWORK_CODES or f.severity < Severity.WARNING or not job_owned(f):
                continue
            job = job_of(f)
            if not job.isdigit() or len(job) > 12:
                continue
            key, line = int(job), log_line(f)
            seen = out.get(key)
            if seen is None:
                out[key] = NcclFailure(key, f.code, line, (n.name,))
            elif seen.line == line and n.name not in seen.nodes:
                out[key] = NcclFailure(key, seen.code, line, (*seen.nodes, n.name))
    return out


def decide_nccl_requeue(
    phase: JobPhase, state: str, since_requeue_s: float | None, dry_run: bool
) -> JobDecision:
    """Requeue a babysat job whose NCCL reported a network failure, or skip it (with why)."""
    if phase == "ended":
        return JobDecision("skip", f"job is {state or 'gone'}: nothing to requeue")
    if since_requeue_s is not None and since_requeue_s < STALE_S:
        return JobDecision(
            "skip",
            f"reported {since_requeue_s:.0f} s after its last requeue: may be the previous "
            "run's last lines",
        )
    if dry_run:
        return JobDecision("skip", "dry-run: no Slurm change")
    return JobDecision("requeue")


def _last_requeue_age(history: Sequence[HistoryEntry], now: datetime) -> float | None:
    for h in reversed(history):
        if h.get("event") == "requeue" and h.get("at"):
            try:
                return (now - datetime.fromisoformat(str(h.get("at")))).total_seconds()
            except (TypeError, ValueError):
                return None
    return None


def _handled(history: Sequence[HistoryEntry], line: str) -> bool:
    return any(h.get("event") == EVENT and h.get("message") == line[:500] for h in history)


class NcclRequeues:
    """Runs every tick on the facts the tick gathered (no query of its own while nothing is
    new): one read of the jobs table and one Slurm lookup per job only for a failure not seen
    before."""

    def __init__(self, jobs: JobTracker) -> None:
        self.jobs = jobs
        self._seen: dict[tuple[int, str], None] = {}  # insertion order: oldest first

    def step(self, facts: Sequence[NodeFacts], now: datetime) -> None:
        new = {
            jid: f for jid, f in network_failures(facts).items() if (jid, f.line) not in self._seen
        }
        if not new:
            return
        rows: dict[int, JobRow] = {int(r.get("job_id") or 0): r for r in self.jobs.store.jobs()}
        by_name = {n.name: n for n in facts}
        for jid, f in sorted(new.items()):
            try:
                self._handle(f, rows.get(jid), by_name, now)
            except SlurmError as exc:  # asked again next tick
                log.debug("job %s: cannot look at its NCCL failure now: %s", jid, exc)
                continue
            except Exception as exc:
                self.jobs.record_error(jid, "nccl requeue", exc, now)
            self._remember((jid, f.line))

    def _remember(self, key: tuple[int, str]) -> None:
        self._seen[key] = None
        while len(self._seen) > SEEN_MAX:
            del self._seen[next(iter(self._seen))]

    def _handle(
        self, f: NcclFailure, row: JobRow | None, by_name: dict[str, NodeFacts], now: datetime
    ) -> None:
        history = list((row or {}).get("history") or [])
        if _handled(history, f.line):
            return  # seen before: this controller restarted, or an agent read it again
        try:
            j = self.jobs.slurm.job(f.job_id)
        except SlurmNotFound:
            return  # gone from slurmctld's memory: nothing to requeue
        try:
            babysat = babysit_spec(j) is not None
        except Exception:  # an invalid spec: its error is shown by the job scan
            babysat = False
        if not babysat:
            return  # left to Slurm, as any job that did not opt in
        d = decide_nccl_requeue(
            job_phase(j.states),
            j.state,
            _last_requeue_age(history, now),
            self.jobs.cfg.policy.dry_run,
        )
        why = f"its NCCL reported a network failure: {f.line}"[:500]
        outcome = d.why
        if d.kind == "requeue":
            exclude = sorted(n for n in j.nodes if n in by_name and _link_down(by_name[n]))
            queued = self.jobs.record_requeue(f.job_id, exclude, why, now=now, rule=NCCL_RULE)
            if queued is not None:  # due at the tick's time: carried out by this very tick
                self.jobs.store.update_action(queued, next_attempt_at=now)
            outcome = "requeue queued" if queued else "a requeue of it was queued already"
        log.info("job %s on %s: %s (%s)", f.job_id, ",".join(f.nodes), why, outcome)
        self.jobs.history.append(
            f.job_id,
            {
                "event": EVENT,
                "at": now.isoformat(),
                "restart_count": j.restart_count,
                "why": why,
                "message": f.line[:500],
                "outcome": outcome[:300],
            },
        )


def _link_down(n: NodeFacts) -> bool:
    """The node's own readings (never a job's line) show a link problem now."""
    return any(
        f.code in NODE_LINK_CODES and f.severity >= Severity.WARNING and not job_owned(f)
        for f in n.open_findings
    )
