"""Slurm 25.11's expedited requeue, for a babysat job babysitter requeues off a faulty node.

What Slurm 25.11 does (read in its source, 25.11.7: slurmctld/job_mgr.c, job_scheduler.c,
node_mgr.c; sbatch(1); slurm.conf(5)):
- A job asks for it at submission only: `sbatch --requeue=expedite` (REST v0.0.44 job
  `flags: ["EXPEDITED_REQUEUE"]`, or job_submit.lua's `bitflags`), accepted only with
  `SlurmctldParameters=enable_expedited_requeue`. `scontrol update` has no way to add it, and a
  REST job update carrying the flag is checked but never applied. `scontrol show job` prints
  `ExpeditedRequeue=Yes` for such a job.
- The expedite itself (state flag EXPEDITING: first in the queue whatever the priorities,
  eligible at once, its old nodes kept from other jobs until it is requeued) is set only when
  slurmctld requeues the job by itself: on a node failure (a node set DOWN, or one that stops
  answering) or a non-zero exit with a failed epilog. An explicit `scontrol requeue` of such a
  job only skips the requeue delay (BeginTime now, not now + requeue_delay); there is no
  expedite option to `scontrol requeue` or REST's requeue.
So for such a job, running on nodes babysitter drained for a fault with nothing else on them,
babysitter declares those nodes failed (`State=DOWN`, its reason kept): Slurm's own node-failure
requeue, which expedites it. Anything else gets the plain requeue.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Sequence
from typing import Any, Protocol

from babysitter.slurm.client import SlurmError, SlurmJob, SlurmNode


class OwnedClient(Protocol):
    """What this module needs of slurm/base.py's OwnedClient (a protocol: base.py imports this
    module, and an import back would be a cycle)."""

    sc: Any  # the backend's command runner (`run`, `config_value`)

    @property
    def controller_version(self) -> tuple[int, int]: ...

    def owns(self, node: SlurmNode) -> bool: ...

    def jobs_on(self, nodes: Collection[str]) -> list[SlurmJob]: ...

    def nodes_named(self, names: Sequence[str]) -> dict[str, SlurmNode]: ...

    def job(self, job_id: int) -> SlurmJob: ...


log = logging.getLogger(__name__)

MIN_VERSION = (25, 11)
_VERSION = re.compile(r"^(\d+)\.(\d+)")


def controller_version(client: OwnedClient) -> tuple[int, int]:
    """slurmctld's (major, minor) from `scontrol show config` (SLURM_VERSION is the
    controller's, not the client binary's); (0, 0) when it cannot be read."""
    m = _VERSION.match(client.sc.config_value("SLURM_VERSION"))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def asked_for(client: OwnedClient, job_id: int) -> bool:
    """The job was submitted with `--requeue=expedite` (scontrol prints it on 25.11+)."""
    out = client.sc.run("scontrol", "show", "job", "-o", str(job_id), what=f"show job {job_id}")
    return re.search(r"\bExpeditedRequeue=Yes\b", out) is not None


def why_not(
    client: OwnedClient, job: SlurmJob, bad: list[str], nodes: dict[str, SlurmNode]
) -> str | None:
    """Why this requeue cannot go through Slurm's expedite (None: it can). `nodes`: the
    faulty nodes as Slurm has them now."""
    for n in bad:
        cur = nodes.get(n)
        if cur is None or not cur.drained_or_draining or not client.owns(cur):
            return f"{n} is not drained by babysitter"
    others = sorted({j.job_id for j in client.jobs_on(bad)} - {job.job_id})
    if others:
        # DOWN would kill or requeue them too: their nodes were only drained
        return f"job(s) {','.join(map(str, others))} also run there"
    return None


def _candidate(client: OwnedClient, job: SlurmJob, bad: list[str]) -> str | None:
    """The cheap checks first (the version is read once): None when the nodes are next."""
    if client.controller_version < MIN_VERSION:
        return "Slurm older than 25.11"
    if not bad:
        return "no faulty node to fail"
    if not job.running or not set(bad) <= set(job.nodes):
        return "the job does not run on the faulty nodes"
    if not asked_for(client, job.job_id):
        return "the job was not submitted with --requeue=expedite"
    return None


def requeue_expedited(client: OwnedClient, job: SlurmJob, bad: list[str]) -> bool:
    """Requeue `job` through Slurm's node-failure path when it can be expedited; False when
    it was not (the caller then requeues it plainly). A DOWN that did not requeue the job (a
    `--no-kill` job keeps running on its other nodes) is also False."""
    nodes: dict[str, SlurmNode] = {}
    try:
        reason = _candidate(client, job, bad)
        if reason is None:
            nodes = client.nodes_named(bad)
            reason = why_not(client, job, bad, nodes)
    except SlurmError as exc:
        reason = f"cannot tell: {exc}"
    if reason is not None:
        log.debug("job %s: plain requeue (%s)", job.job_id, reason)
        return False
    try:
        for n in bad:
            # its own reason again: the node stays babysitter's, now DOWN instead of drained
            client.sc.run(
                "scontrol",
                "update",
                f"NodeName={n}",
                "State=DOWN",
                f"Reason={nodes[n].reason}",
                what=f"fail {n}",
            )
    except SlurmError as exc:
        log.warning("job %s: failing %s: %s", job.job_id, ",".join(bad), exc)
    after = client.job(job.job_id)  # a DOWN that went through requeued it, whatever failed after
    if after.restart_count > job.restart_count:
        log.info(
            "job %s requeued expedited: %s set DOWN (Slurm's node-failure requeue)",
            job.job_id,
            ",".join(bad),
        )
        return True
    log.info("job %s: %s DOWN did not requeue it; plain requeue", job.job_id, ",".join(bad))
    return False


def restarted_elsewhere(client: OwnedClient, job_id: int, bad: list[str]) -> bool:
    """On 25.11+ a requeued job can run again before its ExcNodeList is set: an expedited one
    (first in the queue, eligible at once), or any requeue of a job submitted with
    `--requeue=expedite` (no requeue delay). Then there is nothing left to exclude, as long as
    it runs off the faulty nodes (DOWN or drained: Slurm places nothing there)."""
    j = client.job(job_id)
    return j.running and not set(bad) & set(j.nodes)
