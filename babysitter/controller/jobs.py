"""Babysat jobs: track them from Slurm (AdminComment `babysit=<args>`, or the `--comment`
fallback) and, when their node is drained for a fault (or Slurm marks it down), requeue them
from the newest complete checkpoint: write `<ckpt>/.babysitter/resume.json`, requeue, keep the
bad node(s) out, count it. Past max_requeues the job is held and on-call is told. Jobs that
did not opt in are left to Slurm. One fault -> one requeue."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from babysitter.checkpoints import find_latest_complete, write_resume_json
from babysitter.controller.alerts import Alert
from babysitter.job import babysit_spec
from babysitter.slurm.client import SlurmError, SlurmJob

if TYPE_CHECKING:
    from babysitter.controller.remediation import RemediationEngine

log = logging.getLogger(__name__)
DEFAULT_MAX_REQUEUES = 3
CKPT_SETTLE_S = 10.0  # marker-less formats: files this fresh may still be being written
_last_scan: dict[int, float] = {}


def _babysat(jobs: list[SlurmJob]) -> list[tuple[SlurmJob, dict[str, Any]]]:
    out = []
    for j in jobs:
        spec = babysit_spec(j.admin_comment, j.comment)
        if spec is not None:
            out.append((j, spec))
    return out


def tick(engine: RemediationEngine, now: datetime) -> None:
    """Refresh the jobs table; requeue babysat jobs stranded on nodes Slurm marked DOWN."""
    key = id(engine)
    if time.monotonic() - _last_scan.get(key, 0.0) < engine.cfg.slurm.job_scan_s:
        return
    _last_scan[key] = time.monotonic()
    try:
        jobs = engine.slurm.jobs()
    except SlurmError as exc:
        log.debug("cannot list jobs: %s", exc)
        return
    known = {r["job_id"]: r for r in engine.store.jobs()}
    down = {n for n, sn in engine.slurm_nodes.items() if sn.down}
    for j, spec in _babysat(jobs):
        row = known.get(j.job_id)
        values = {
            "name": j.name,
            "user": j.user,
            "nodes": list(j.nodes),
            "state": "+".join(j.states),
            "babysit": spec,
            "restart_count": j.restart_count,
        }
        engine.store.upsert_job(j.job_id, **values)
        if j.running and down & set(j.nodes):
            requeue_job(
                engine,
                j,
                spec,
                sorted(down & set(j.nodes)),
                f"node {', '.join(sorted(down & set(j.nodes)))} is DOWN",
                now,
                row,
            )
        elif j.running and spec.get("hang_timeout") and spec.get("ckpt"):
            _check_hang(engine, j, spec, now)


def heartbeat_age(ckpt: str, job_id: int, now_ts: float) -> float | None:
    """Seconds since the job's last progress signal: its heartbeat file (written by
    babysitter.job.heartbeat), else the newest file under its checkpoint directory."""
    hb = Path(ckpt) / ".babysitter" / f"heartbeat-{job_id}.json"
    try:
        return now_ts - float(json.loads(hb.read_text())["time"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        newest = max((p.stat().st_mtime for p in Path(ckpt).rglob("*")), default=None)
    except OSError:
        return None
    return None if newest is None else now_ts - newest


def gpus_idle(engine: RemediationEngine, nodes: tuple[str, ...]) -> bool | None:
    """True when every GPU on the job's nodes is below the idle threshold in their latest
    reports; None when no node reported utilisation (no GPUs, or an old agent)."""
    limit = engine.cfg.policy.idle_gpu_util_percent
    seen = False
    for name in nodes:
        row = engine.store.node(name)
        util = ((row or {}).get("metrics") or {}).get("gpu_util") or {}
        for v in util.values():
            seen = True
            if float(v) >= limit:
                return False
    return True if seen else None


def _check_hang(
    engine: RemediationEngine, j: SlurmJob, spec: dict[str, Any], now: datetime
) -> None:
    age = heartbeat_age(spec["ckpt"], j.job_id, now.timestamp())
    cond = f"job_hung_{j.job_id}"
    # no progress for hang_timeout AND its GPUs idle (when utilisation is known): a slow
    # step that keeps the GPUs busy is not a hang
    hung = (
        age is not None and age > spec["hang_timeout"] and gpus_idle(engine, j.nodes) is not False
    )
    if hung and age is not None:
        requeue = engine.cfg.policy.requeue_hung_jobs
        why = (
            f"job {j.job_id} ({j.name}) on {','.join(j.nodes)} made no progress for "
            f"{age:.0f} s (hang_timeout {spec['hang_timeout']} s) with idle GPUs"
        )
        engine.router.process(
            [
                Alert(
                    None,
                    cond,
                    "warning",
                    why,
                    "requeued it from its last checkpoint"
                    if requeue
                    else "nothing changed: the job keeps its nodes",
                    now,
                    details={"job_id": j.job_id},
                )
            ],
            [],
            now,
        )
        if requeue:
            requeue_job(
                engine,
                j,
                spec,
                [],
                why,
                now,
                next((r for r in engine.store.jobs() if r["job_id"] == j.job_id), None),
            )
    elif age is not None:
        engine.router.process([], [(None, cond)], now)


def on_drain(
    engine: RemediationEngine,
    node: str,
    reason: str,
    now: datetime,
    jobs: list[SlurmJob] | None = None,
) -> None:
    """A node was just drained for a fault: requeue the babysat jobs running on it. `jobs`:
    a listing shared by every node drained in the same batch (one Slurm call for all)."""
    try:
        jobs = engine.slurm.jobs_on([node]) if jobs is None else jobs
    except SlurmError as exc:
        log.warning("drained %s but cannot list its jobs: %s", node, exc)
        return
    known = {r["job_id"]: r for r in engine.store.jobs()}
    for j, spec in _babysat(jobs):
        if node in j.nodes and (j.running or "COMPLETING" in j.states):
            requeue_job(engine, j, spec, [node], reason, now, known.get(j.job_id))


def requeue_job(
    engine: RemediationEngine,
    j: SlurmJob,
    spec: dict[str, Any],
    bad_nodes: list[str],
    why: str,
    now: datetime,
    row: dict[str, Any] | None,
) -> None:
    store = engine.store
    history: list[dict[str, Any]] = list((row or {}).get("history") or [])
    # one fault -> one requeue: this restart generation was already handled
    if any(
        h.get("restart_count") == j.restart_count and h.get("event") == "requeue" for h in history
    ):
        return
    done = int((row or {}).get("requeues") or 0)
    limit = int(spec.get("max_requeues", DEFAULT_MAX_REQUEUES))
    if done >= limit:
        _hold(engine, j, bad_nodes, why, now, history, limit)
        return
    resume_point = None
    ckpt = spec.get("ckpt")
    explanation = "no checkpoint directory given: restarts from scratch"
    if ckpt:
        try:
            choice = find_latest_complete(ckpt, settle_s=CKPT_SETTLE_S)
            if choice is not None:
                write_resume_json(ckpt, choice, j.job_id, j.restart_count + 1)
                resume_point = str(choice.path)
                explanation = choice.explanation
            else:
                explanation = "no complete checkpoint yet: restarts from scratch"
        except OSError as exc:
            explanation = f"cannot read checkpoints in {ckpt}: {exc}"
    aid = store.record_action(
        "requeue",
        node=bad_nodes[0] if bad_nodes else None,
        job_id=j.job_id,
        reason=why,
        rule="job_on_failed_node",
        requested_by="policy",
    )
    try:
        engine.slurm.requeue(j.job_id, exclude=bad_nodes)
    except SlurmError as exc:
        store.update_action(aid, status="failed", done_at=now, outcome=str(exc))
        history.append(
            {
                "event": "requeue_failed",
                "at": now.isoformat(),
                "error": str(exc),
                "restart_count": j.restart_count,
            }
        )
        store.upsert_job(j.job_id, history=history)
        return
    store.update_action(
        aid,
        status="done",
        done_at=now,
        outcome=f"requeued, excluding {','.join(bad_nodes)}; resume from "
        f"{resume_point or 'scratch'}",
    )
    engine.metrics.requeues.labels("done").inc()
    history.append(
        {
            "event": "requeue",
            "at": now.isoformat(),
            "restart_count": j.restart_count,
            "excluded": bad_nodes,
            "resume_point": resume_point,
            "why": why,
            "checkpoint": explanation,
        }
    )
    store.upsert_job(
        j.job_id,
        requeues=done + 1,
        resume_point=resume_point,
        history=history,
        babysit=spec,
        nodes=list(j.nodes),
        state="REQUEUED",
    )


def _hold(
    engine: RemediationEngine,
    j: SlurmJob,
    bad_nodes: list[str],
    why: str,
    now: datetime,
    history: list[dict[str, Any]],
    limit: int,
) -> None:
    if any(h.get("event") == "held" and h.get("restart_count") == j.restart_count for h in history):
        return
    store = engine.store
    aid = store.record_action(
        "hold",
        job_id=j.job_id,
        node=bad_nodes[0] if bad_nodes else None,
        reason=why,
        rule="max_requeues",
        requested_by="policy",
    )
    try:
        # requeue held: off the broken node, kept in the queue for a human
        engine.slurm.requeue(j.job_id, exclude=bad_nodes, hold=True)
        store.update_action(aid, status="done", done_at=now, outcome="requeued held")
    except SlurmError as exc:
        store.update_action(aid, status="failed", done_at=now, outcome=str(exc))
    history.append(
        {"event": "held", "at": now.isoformat(), "restart_count": j.restart_count, "why": why}
    )
    store.upsert_job(j.job_id, history=history, state="HELD")
    engine.router.process(
        [
            Alert(
                None,
                "job_requeue_limit",
                "warning",
                f"job {j.job_id} ({j.name}) hit max_requeues={limit} after: {why}",
                f"requeued job {j.job_id} held, excluding {','.join(bad_nodes)}",
                now,
                details={"job_id": j.job_id},
            )
        ],
        [],
        now,
    )
