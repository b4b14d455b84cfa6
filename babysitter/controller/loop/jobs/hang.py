"""The hang watch: a babysat job whose progress signal (its heartbeat file, else its newest
checkpoint file) stopped for its hang_timeout while its GPUs sit idle is reported, and requeued
when [policy] requeue_hung_jobs says so; the alert resolves once it makes progress again."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from babysitter.checkpoints import owner as ckpt_owner
from babysitter.config import Config
from babysitter.controller.db.store import Store
from babysitter.controller.loop.record.alerts import Alert, AlertRouter
from babysitter.finding import Severity
from babysitter.job import BabysitSpec
from babysitter.slurm.client import SlurmJob

# queues a requeue of the job off the given nodes: (job_id, bad_nodes, why)
RecordRequeue = Callable[[int, list[str], str], object]


def heartbeat_age(ckpt: str, job_id: int, now_ts: float, user: str | None = None) -> float | None:
    """Seconds since the job's last progress signal: its heartbeat file (written by
    babysitter.job.heartbeat), else the newest file under its checkpoint directory. Read as
    the job's owner `user` (None: as this process), see babysitter.checkpoints.owner."""
    return ckpt_owner.heartbeat_age(ckpt, user, job_id, now_ts)


class HangWatch:
    def __init__(
        self, cfg: Config, store: Store, router: AlertRouter, record_requeue: RecordRequeue
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.router = router
        self.record_requeue = record_requeue
        self._hb_read: dict[int, float] = {}  # job -> monotonic time of its last heartbeat read

    def forget_all_but(self, live: set[int]) -> None:
        """Forget jobs that left the queue: a long-running controller sees millions of ids."""
        for gone in self._hb_read.keys() - live:
            del self._hb_read[gone]

    def gpus_idle(self, nodes: tuple[str, ...]) -> bool | None:
        """True when every GPU on the job's nodes is below the idle threshold in their latest
        reports; None when no node reported utilisation (no GPUs, or an old agent)."""
        limit = self.cfg.policy.idle_gpu_util_percent
        seen = False
        for name in nodes:
            row = self.store.node(name)
            util = ((row or {}).get("metrics") or {}).get("gpu_util") or {}
            for v in util.values():
                seen = True
                if float(v) >= limit:
                    return False
        return True if seen else None

    def check(self, j: SlurmJob, spec: BabysitSpec, now: datetime) -> None:
        # each read starts a helper process as the job's owner: at most every hang_timeout/10 s
        if time.monotonic() - self._hb_read.get(j.job_id, -1e9) < max(
            self.cfg.slurm.job_scan_s, spec["hang_timeout"] / 10
        ):
            return
        self._hb_read[j.job_id] = time.monotonic()
        age = heartbeat_age(spec["ckpt"], j.job_id, now.timestamp(), j.user)
        cond = f"job_hung_{j.job_id}"
        # no progress for hang_timeout AND its GPUs idle (when utilisation is known): a slow
        # step that keeps the GPUs busy is not a hang
        hung = (
            age is not None and age > spec["hang_timeout"] and self.gpus_idle(j.nodes) is not False
        )
        if hung and age is not None:
            requeue = self.cfg.policy.requeue_hung_jobs
            why = (
                f"job {j.job_id} ({j.name[:100]}) on {','.join(j.nodes)} made no progress for "
                f"{age:.0f} s (hang_timeout {spec['hang_timeout']} s) with idle GPUs"
            )
            self.router.process(
                [
                    Alert(
                        None,
                        cond,
                        Severity.WARNING,
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
                self.record_requeue(j.job_id, [], why)
        elif age is not None:
            self.router.process([], [(None, cond)], now)
