"""Folding a batch of committed reports into the nodes' state (ingest.py's writer calls it in
the batch's transaction): two executemany statements per batch (one INSERT for nodes seen the
first time, one UPDATE), state that only moves forward, the clean streak a resume counts, and
the cap on a node's open findings (the rest fold into one finding per owner that counts them)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection

from babysitter.controller.db import models as m
from babysitter.controller.db.store import aware, stored_severity
from babysitter.controller.loop.decide.node.verdict import drain_worthy
from babysitter.finding import Action, Finding, Severity, job_of, job_owned, no_verdict
from babysitter.report import Report

# The open findings a node keeps at most; the rest fold into one finding that counts them.
MAX_OPEN_FINDINGS = 256
FOLDED_CODE = "ingest.findings_folded"


def fold_reports(
    conn: Connection,
    reports: list[tuple[str, Report]],
    received: datetime,
    max_open_findings: int = MAX_OPEN_FINDINGS,
) -> None:
    """Fold a batch of reports into node state with two executemany statements (one
    INSERT for nodes seen the first time, one UPDATE), not one statement per node.
    State only moves forward: a report sent before the node's newest applied one (a spool
    replay, a late retry) stays in the history but changes nothing and is not counted as
    clean; it still shows the agent is alive."""
    if not reports:
        return
    names = sorted({r.node for _, r in reports})
    existing = _read_nodes(conn, names, reports)
    _insert_new_nodes(conn, [n for n in names if n not in existing], existing, received)
    applied: set[str] = set()
    for rid, r in reports:  # in order of sending: each moves its node's state forward
        if fold_report(existing[r.node], rid, r, received, max_open_findings):
            applied.add(r.node)
    _write_nodes(conn, names, existing, applied, received)


def fold_report(
    node: dict[str, Any], rid: str, r: Report, received: datetime, max_open_findings: int
) -> bool:
    """Apply one report to its node's state (in place); False for a report older than the
    state, which changes nothing."""
    # a clock ahead of the controller's must not freeze the node's state
    at = min(aware(r.sent_at) or received, received)
    last = aware(node.get("last_sent_at"))
    if last is not None and at < last:
        return False
    problems = [f.to_json_dict() for f in r.findings if f.severity in _PROBLEM]
    # a report is clean for the resume when nothing in it would drain the node: a warning
    # (an application's XID, kept until the next reboot) or a job's own log line stays an
    # open finding, but must not keep a node drained for a fault that is gone for good.
    # A crashed check or an unreadable source (no_verdict) is unknown, never clean: it
    # breaks the streak, so a resume needs that many clean reports after it
    node_clean = not any(drain_worthy(f) or no_verdict(f) for f in r.findings)
    if r.kind == "event":
        keys = {(f["check"], f["component"], f["code"]) for f in problems}
        kept = [
            f
            for f in node["open_findings"] or []
            if (f["check"], f["component"], f["code"]) not in keys
        ]
        open_f = kept + problems
        clean = node["consecutive_clean"] if node_clean else 0
    else:
        open_f = problems
        clean = (node["consecutive_clean"] or 0) + 1 if node_clean else 0
    if len(open_f) > max_open_findings:
        open_f = _fold(open_f, max_open_findings, received)
    worst = max(
        (stored_severity(f["severity"]) for f in open_f),
        default=Severity.OK,
        key=_RANK.__getitem__,
    )
    node.update(
        open_findings=open_f,
        consecutive_clean=clean,
        worst_severity=str(worst),
        last_report_id=rid,
        last_sent_at=at,
        metrics=r.metrics or node.get("metrics"),
    )
    return True


def _read_nodes(
    conn: Connection, names: list[str], reports: list[tuple[str, Report]]
) -> dict[str, dict[str, Any]]:
    """The stored state of the batch's nodes that exist, by name."""
    existing = {row.name: row._asdict() for row in conn.execute(_STATE_READ, {"names": names})}
    # The stored JSON is only needed where it survives the batch: open findings under an
    # event report (merged, not replaced) and metrics under a report without any. Reading
    # and decoding it for every node was a fifth of the writer's time.
    keep = sorted(
        {r.node for _, r in reports if r.kind == "event" or not r.metrics} & existing.keys()
    )
    if keep:
        for row in conn.execute(_JSON_READ, {"names": keep}):
            existing[row.name].update(open_findings=row.open_findings, metrics=row.metrics)
    return existing


def _insert_new_nodes(
    conn: Connection, new_names: list[str], existing: dict[str, dict[str, Any]], received: datetime
) -> None:
    """Rows for nodes seen the first time, and their empty state in `existing`."""
    if not new_names:
        return
    conn.execute(
        m.nodes.insert(),
        [
            {
                "name": n,
                "first_seen_at": received,
                "open_findings": [],
                "consecutive_clean": 0,
                "worst_severity": "ok",
                "verdict": "unknown",
                "babysitter_drained": False,
            }
            for n in new_names
        ],
    )
    for n in new_names:
        existing[n] = {
            "name": n,
            "open_findings": [],
            "consecutive_clean": 0,
            "metrics": None,
            "last_sent_at": None,
        }


def _write_nodes(
    conn: Connection,
    names: list[str],
    existing: dict[str, dict[str, Any]],
    applied: set[str],
    received: datetime,
) -> None:
    """The new state of nodes a report moved; only liveness for the others."""
    if applied:
        conn.execute(
            NODE_STATE_UPDATE,
            [
                {
                    "b_name": n,
                    "open_findings": existing[n]["open_findings"],
                    "consecutive_clean": existing[n]["consecutive_clean"],
                    "worst_severity": existing[n]["worst_severity"],
                    "last_report_at": received,
                    "last_report_id": existing[n]["last_report_id"],
                    "last_sent_at": existing[n]["last_sent_at"],
                    "metrics": existing[n].get("metrics"),
                }
                for n in sorted(applied)
            ],
        )
    stale = [n for n in names if n not in applied]
    if stale:
        conn.execute(NODE_ALIVE_UPDATE, [{"b_name": n, "last_report_at": received} for n in stale])


# The batch's rows, read with statements built once (an expanding IN): building a select and
# working out its cache key for each batch cost more than running it.
_BATCH_NODES = m.nodes.c.name.in_(bindparam("names", expanding=True))
_STATE_READ = select(
    m.nodes.c.name,
    m.nodes.c.consecutive_clean,
    m.nodes.c.last_sent_at,
    m.nodes.c.last_report_id,
).where(_BATCH_NODES)
_JSON_READ = select(m.nodes.c.name, m.nodes.c.open_findings, m.nodes.c.metrics).where(_BATCH_NODES)

# What one report changes in its node's row (executemany, keyed by b_name).
NODE_STATE_UPDATE = (
    update(m.nodes)
    .where(m.nodes.c.name == bindparam("b_name"))
    .values(
        open_findings=bindparam("open_findings"),
        consecutive_clean=bindparam("consecutive_clean"),
        worst_severity=bindparam("worst_severity"),
        last_report_at=bindparam("last_report_at"),
        last_report_id=bindparam("last_report_id"),
        last_sent_at=bindparam("last_sent_at"),
        metrics=bindparam("metrics"),
    )
)
# A report that is older than the node's state: only the node's liveness moves.
NODE_ALIVE_UPDATE = (
    update(m.nodes)
    .where(m.nodes.c.name == bindparam("b_name"))
    .values(last_report_at=bindparam("last_report_at"))
)

# plain dict lookups: Severity's rich comparisons are Python calls, ~10 per report on ingest
_RANK = {s: s.rank for s in Severity}
_PROBLEM = frozenset(s for s in Severity if s > Severity.INFO)


def worst_severity(findings: Iterable[Finding]) -> Severity:
    return max((f.severity for f in findings), default=Severity.OK, key=_RANK.__getitem__)


def _fold(open_f: list[dict[str, Any]], cap: int, at: datetime) -> list[dict[str, Any]]:
    """Keep the most severe (then node-owned, then newest) open findings and count the rest in
    one summary per owner, so a node that sends ever new finding keys cannot grow its state
    without bound: the node's own evidence on `host`, where the worst severity survives (a
    folded critical still drains), and evidence from jobs' own output on a `job:` component,
    job-owned like what it counts (`job_owned`: a job writing hundreds of log lines never
    drains its nodes through the fold)."""
    prior: list[dict[str, Any]] = []
    plain: list[dict[str, Any]] = []
    for f in open_f:
        is_summary = f.get("code") == FOLDED_CODE and f.get("check") == "babysitter.ingest"
        (prior if is_summary else plain).append(f)
    plain.sort(
        key=lambda f: (
            _RANK[stored_severity(f["severity"])],
            not job_owned(f),
            str(f["observed_at"]),
        ),
        reverse=True,
    )
    rest = plain[cap - 1 :]
    if len({job_owned(f) for f in [*prior, *rest]}) > 1:
        rest = plain[max(cap - 2, 0) :]  # a summary each: one place less for what is kept
    kept = plain[: len(plain) - len(rest)]
    summaries = []
    for jobs in (False, True):
        old = [f for f in prior if job_owned(f) is jobs]
        new = [f for f in rest if job_owned(f) is jobs]
        if old or new:
            summaries.append(_summary(old, new, at, jobs))
    return [*kept, *summaries]


def _summary(
    prior: list[dict[str, Any]], rest: list[dict[str, Any]], at: datetime, jobs: bool
) -> dict[str, Any]:
    """One owner's fold: the findings `rest` and earlier summaries `prior` counted in one."""
    folded, codes, job_ids = len(rest), {str(f["code"]) for f in rest}, set[str]()
    sev = Severity.WARNING
    for f in prior:
        d = f.get("details") or {}
        folded += int(d.get("folded", 0))
        codes.update(str(c) for c in d.get("codes", []))
        job_ids.update(str(j) for j in d.get("jobs", []))
    for f in [*prior, *rest]:
        sev = max(sev, stored_severity(f["severity"]), key=_RANK.__getitem__)
    if not jobs:
        return Finding(
            check="babysitter.ingest",
            component="host",
            severity=sev,
            code=FOLDED_CODE,
            message=f"{folded} more open findings than the controller keeps per node (worst {sev})",
            action=Action.INSPECT,
            observed_at=at,
            details={"folded": folded, "codes": sorted(codes)[:20]},
        ).to_json_dict()
    job_ids.update(job_of(f) for f in rest)
    job = next(iter(job_ids)) if len(job_ids) == 1 else "several"
    return Finding(
        check="babysitter.ingest",
        component=f"job:{job}",
        severity=sev,
        code=FOLDED_CODE,
        message=f"{folded} more open findings from jobs' own output than the controller keeps "
        f"per node (worst {sev}; never a drain on its own)",
        action=Action.INSPECT,
        observed_at=at,
        details={
            "folded": folded,
            "codes": sorted(codes)[:20],
            "jobs": sorted(job_ids)[:20],
            "job_id": job,
        },
    ).to_json_dict()
