"""Executing one recorded requeue action (the engine's executor calls it, retrying while Slurm
is unavailable): decide it (job_policy.py), prepare the resume point from the newest complete
checkpoint, requeue keeping the bad node(s) out, count it; past max_requeues the job is held
and on-call is told."""

from __future__ import annotations

from datetime import datetime

from babysitter.checkpoints import owner as ckpt_owner
from babysitter.controller.db.store import HistoryEntry, JobRow
from babysitter.controller.loop.admit.gate import AdmittedSlurm
from babysitter.controller.loop.decide.link_hold import job_phase
from babysitter.controller.loop.jobs.job_history import JobHistory
from babysitter.controller.loop.jobs.job_policy import babysit_spec, decide_requeue, max_requeues
from babysitter.controller.loop.record.alerts import Alert, AlertRouter
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.finding import Severity
from babysitter.job import BabysitSpec
from babysitter.slurm.client import SlurmClient, SlurmJob

CKPT_SETTLE_S = 10.0  # marker-less formats: files this fresh may still be being written


class Requeuer:
    def __init__(
        self,
        slurm: SlurmClient,
        metrics: ControllerMetrics,
        router: AlertRouter,
        history: JobHistory,
    ) -> None:
        self.slurm = slurm
        self.metrics = metrics
        self.router = router
        self.history = history

    def execute(
        self,
        job_id: int,
        bad_nodes: list[str],
        why: str,
        now: datetime,
        failed_ok: bool = False,
    ) -> tuple[str, str]:
        """(status, outcome) of one requeue action. SlurmUnavailable propagates: the action
        stays pending and is retried. `failed_ok`: a job that failed by itself is requeued
        too (a held requeue: the link killed it during the grace)."""
        j = self.slurm.job(job_id)
        died = failed_ok and job_phase(j.states) == "failed"
        if not (j.running or "COMPLETING" in j.states or died):
            return "skipped", f"job {job_id} is {j.state or 'gone'}: nothing to requeue"
        spec = babysit_spec(j) or {}
        row = self.history.row(job_id) or {}
        history: list[HistoryEntry] = list(row.get("history") or [])
        limit = max_requeues(spec)
        d = decide_requeue(j.restart_count, int(row.get("requeues") or 0), history, limit)
        if d.kind == "skip":
            return "skipped", d.why
        if d.kind == "hold":
            return self._hold(j, bad_nodes, why, now, limit)
        return self._requeue(j, spec, row, history, bad_nodes, why, now)

    def _requeue(
        self,
        j: SlurmJob,
        spec: BabysitSpec,
        row: JobRow,
        history: list[HistoryEntry],
        bad_nodes: list[str],
        why: str,
        now: datetime,
    ) -> tuple[str, str]:
        resume_point = None
        ckpt = spec.get("ckpt")
        explanation = "no checkpoint directory given: restarts from scratch"
        if ckpt:
            # as the job's owner, in a bounded helper process: never raises
            outcome = ckpt_owner.prepare_resume(
                ckpt, j.user, j.job_id, j.restart_count + 1, settle_s=CKPT_SETTLE_S
            )
            resume_point, explanation = outcome.resume_point, outcome.explanation
        exclude = self._exclude(j, bad_nodes)
        AdmittedSlurm(self.slurm).requeue(j.job_id, exclude=exclude)  # the job's, never a node's
        self.metrics.requeues.labels("done").inc()
        history.append(
            {
                "event": "requeue",
                "at": now.isoformat(),
                "restart_count": j.restart_count,
                "excluded": exclude,
                "resume_point": resume_point,
                "why": why[:500],
                "checkpoint": explanation[:500],
            }
        )
        self.history.save(
            j.job_id,
            history,
            requeues=int(row.get("requeues") or 0) + 1,
            resume_point=resume_point,
            babysit=spec,
            nodes=list(j.nodes),
            state="REQUEUED",
        )
        return "done", (
            f"requeued, excluding {','.join(exclude) or 'nothing'}; resume from "
            f"{resume_point or 'scratch'}"
        )

    def _exclude(self, j: SlurmJob, bad_nodes: list[str]) -> list[str]:
        """The bad nodes to keep out, unless that leaves the job nowhere to run: a job whose
        required node list (--nodelist) names a bad node would pend forever. Then the bad node
        stays out of the exclude list and on-call is told (Slurm keeps the node drained, so
        the job waits for it visibly rather than silently)."""
        required = set(j.extra.get("required_nodes", "").split(",")) - {""}
        stuck = sorted(required & set(bad_nodes))
        if not stuck:
            return list(bad_nodes)
        self.router.process(
            [
                Alert(
                    None,
                    f"job_unplaceable_{j.job_id}",
                    Severity.WARNING,
                    f"job {j.job_id} ({j.name[:100]}) requires node(s) {','.join(stuck)}, "
                    "which babysitter drained: it waits for them to be resumed",
                    f"requeued job {j.job_id} without excluding {','.join(stuck)}",
                    datetime.now().astimezone(),
                    details={"job_id": j.job_id},
                )
            ],
            [],
        )
        return [n for n in bad_nodes if n not in stuck]

    def _hold(
        self, j: SlurmJob, bad_nodes: list[str], why: str, now: datetime, limit: int
    ) -> tuple[str, str]:
        # requeue held: off the broken node, kept in the queue for a human
        AdmittedSlurm(self.slurm).requeue(j.job_id, exclude=bad_nodes, hold=True)
        self.history.append(
            j.job_id,
            {"event": "held", "at": now.isoformat(), "restart_count": j.restart_count, "why": why},
            state="HELD",
        )
        self.router.process(
            [
                Alert(
                    None,
                    f"job_requeue_limit_{j.job_id}",
                    Severity.WARNING,
                    f"job {j.job_id} ({j.name[:100]}) hit max_requeues={limit} after: {why}",
                    f"requeued job {j.job_id} held, excluding {','.join(bad_nodes)}",
                    now,
                    details={"job_id": j.job_id},
                )
            ],
            [],
            now,
        )
        return "done", "requeued held (max_requeues reached)"
