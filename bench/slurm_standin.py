"""An in-memory Slurm stand-in for benchmarks that simulate clusters far larger than this
machine can run (10,000 nodes). It follows the client contract (ownership rules, typed errors)
and can add a per-call latency like a real slurmctld round trip. Not used where real Slurm runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import replace

from babysitter.slurm.client import (
    SlurmBusy,
    SlurmClient,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmNotFound,
    SlurmNotOwned,
    SlurmRejected,
    each,
)


class InMemorySlurm(SlurmClient):
    def __init__(
        self,
        node_names: list[str],
        partition_of: dict[str, str] | None = None,
        reason_prefix: str = "babysitter:",
        call_latency_s: float = 0.0,
    ) -> None:
        self.reason_prefix = reason_prefix
        self.call_latency_s = call_latency_s
        self._lock = threading.Lock()
        self._nodes = {
            n: SlurmNode(
                name=n,
                state="IDLE",
                partitions=((partition_of or {}).get(n, "gpu"),),
            )
            for n in node_names
        }
        self._jobs: dict[int, SlurmJob] = {}
        self._holds: dict[str, tuple[str, ...]] = {}  # reservation -> nodes
        self.calls: list[tuple[str, str]] = []  # (operation, target) in order, for assertions

    def _pause(self, op: str, target: str) -> None:
        if self.call_latency_s:
            time.sleep(self.call_latency_s)
        self.calls.append((op, target))

    def add_job(self, job: SlurmJob) -> None:
        with self._lock:
            self._jobs[job.job_id] = job

    def remove_job(self, job_id: int) -> None:
        """The job left Slurm (ended, or its record aged out)."""
        with self._lock:
            self._jobs.pop(job_id, None)

    def nodes(self) -> list[SlurmNode]:
        self._pause("nodes", "*")
        with self._lock:
            return list(self._nodes.values())

    def node(self, name: str) -> SlurmNode:
        self._pause("node", name)
        with self._lock:
            try:
                return self._nodes[name]
            except KeyError:
                raise SlurmNotFound(f"unknown node {name}") from None

    def jobs(self) -> list[SlurmJob]:
        self._pause("jobs", "*")
        with self._lock:
            return list(self._jobs.values())

    def job(self, job_id: int) -> SlurmJob:
        self._pause("job", str(job_id))
        with self._lock:
            try:
                return self._jobs[job_id]
            except KeyError:
                raise SlurmNotFound(f"Invalid job id specified for job {job_id}") from None

    def _owned(self, node: SlurmNode) -> bool:
        return node.reason.startswith(self.reason_prefix)

    def drain(self, node: str, reason: str) -> None:
        self._pause("drain", node)
        self._drain(node, reason)

    def _drain(self, node: str, reason: str) -> None:
        with self._lock:
            n = self._nodes.get(node)
            if n is None:
                raise SlurmNotFound(f"unknown node {node}")
            if n.reason and not self._owned(n):
                raise SlurmNotOwned(f"{node} is drained by someone else: {n.reason}")
            self._nodes[node] = replace(
                n, flags=n.flags | {"DRAIN"}, reason=f"{self.reason_prefix} {reason}"
            )

    def drain_many(self, nodes: Sequence[str], reason: str) -> dict[str, SlurmError | None]:
        """One call for the batch, as the real backends make it (one lookup + one update)."""
        self._pause("drain_many", ",".join(nodes))
        return each(nodes, lambda n: self._drain(n, reason))

    def resume_many(
        self, nodes: Sequence[str], manual: bool = False
    ) -> dict[str, SlurmError | None]:
        self._pause("resume_many", ",".join(nodes))
        return each(nodes, self._resume)

    def jobs_on(self, nodes: Collection[str]) -> list[SlurmJob]:
        self._pause("jobs", ",".join(nodes))
        with self._lock:
            return [j for j in self._jobs.values() if set(nodes) & set(j.nodes)]

    def resume(self, node: str, manual: bool = False) -> None:
        self._pause("resume", node)
        self._resume(node)

    def _resume(self, node: str) -> None:
        with self._lock:
            n = self._nodes.get(node)
            if n is None:
                raise SlurmNotFound(f"unknown node {node}")
            if not self._owned(n):
                raise SlurmNotOwned(f"{node}: reason {n.reason!r} is not babysitter's")
            self._nodes[node] = replace(n, flags=n.flags - {"DRAIN"}, reason="")

    def reboot_program(self) -> str:
        """No RebootProgram: the stand-in cannot reboot a node (the healer leaves a node whose
        next rung is a reboot to a human, instead of failing on every tick)."""
        return ""

    def cancel_reboot(self, node: str) -> None:
        """Withdraw a reboot not yet under way (Slurm refuses when there is none)."""
        self._pause("cancel_reboot", node)
        with self._lock:
            n = self._nodes.get(node)
            if n is None:
                raise SlurmNotFound(f"unknown node {node}")
            if not n.flags & {"REBOOT_REQUESTED", "REBOOT"}:
                raise SlurmRejected(f"{node}: no reboot to cancel")
            self._nodes[node] = replace(n, flags=n.flags - {"REBOOT_REQUESTED", "REBOOT"})

    def cancel_job(self, job_id: int) -> None:
        """scancel: the job leaves Slurm's queue (SlurmNotFound when it is not there)."""
        self._pause("cancel_job", str(job_id))
        with self._lock:
            if self._jobs.pop(job_id, None) is None:
                raise SlurmNotFound(f"Invalid job id specified for job {job_id}")

    def requeue(self, job_id: int, exclude: list[str] | None = None, hold: bool = False) -> None:
        self._pause("requeue", str(job_id))
        with self._lock:
            j = self._jobs.get(job_id)
            if j is None:
                raise SlurmNotFound(f"Invalid job id specified for job {job_id}")
            if not j.requeue:
                raise SlurmRejected(f"Requested operation is presently disabled for job {job_id}")
            self._jobs[job_id] = replace(
                j,
                states=("PENDING",),
                nodes=(),
                restart_count=j.restart_count + 1,
                excluded_nodes=tuple(sorted(set(j.excluded_nodes) | set(exclude or []))),
            )

    def hold(self, job_id: int) -> None:
        self._pause("hold", str(job_id))

    def release(self, job_id: int) -> None:
        self._pause("release", str(job_id))

    # holds (reservations) of the SDC schedule: refused when a job holds a node, like Slurm
    def hold_idle(self, name: str, nodes: Sequence[str], user: str, minutes: int) -> None:
        self._pause("hold_idle", name)
        with self._lock:
            busy = {n for j in self._jobs.values() if j.running for n in j.nodes}
            if busy & set(nodes):
                raise SlurmBusy("Error creating the reservation: Requested nodes are busy")
            self._holds[name] = tuple(nodes)

    def shrink_hold(self, name: str, nodes: Sequence[str]) -> None:
        self._pause("shrink_hold", name)
        with self._lock:
            if name not in self._holds:
                raise SlurmNotFound("Requested reservation is invalid")
            self._holds[name] = tuple(nodes)

    def release_hold(self, name: str) -> None:
        self._pause("release_hold", name)
        with self._lock:
            self._holds.pop(name, None)

    def holds(self, prefix: str) -> dict[str, tuple[str, ...]]:
        self._pause("holds", prefix)
        with self._lock:
            return {k: v for k, v in self._holds.items() if k.startswith(prefix)}
