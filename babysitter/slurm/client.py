"""The one narrow interface to Slurm. Everything else in babysitter talks to Slurm through this.

Backends implement `SlurmClient`; `make_client(config)` picks one. Ownership rules (NHC's):
- `drain` prefixes the reason with the configured prefix and never overwrites another reason;
- `resume` refuses a node whose reason does not start with our prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from babysitter.errors import BabysitterError
from babysitter.slurm.ownership import ReasonOwner
from babysitter.slurm.topology import Topology


class SlurmError(BabysitterError):
    """A Slurm command or API call failed; `slurm_message` is Slurm's own text."""

    def __init__(self, message: str, slurm_message: str = "") -> None:
        super().__init__(message)
        self.slurm_message = slurm_message


class SlurmUnavailable(SlurmError):
    """slurmctld/slurmrestd could not be reached or timed out: retry later."""


class SlurmNotFound(SlurmError):
    """Unknown node or job."""


class SlurmNotOwned(SlurmError):
    """The node's drain/down reason belongs to someone else; babysitter leaves it alone."""


class SlurmRejected(SlurmError):
    """Slurm refused the operation (e.g. requeue of a --no-requeue job)."""


class SlurmNodeSettling(SlurmRejected):
    """Slurm refused a node's resume in a state that is still moving (back from a reboot):
    not a verdict on the node, asked again later."""


class SlurmBusy(SlurmRejected):
    """A hold (reservation) was refused because a job holds one of its nodes."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, ...
    flags: frozenset[str] = frozenset()  # DRAIN, NOT_RESPONDING, ...
    reason: str = ""
    reason_user: str = ""
    partitions: tuple[str, ...] = ()
    gres: str = ""
    jobs: tuple[int, ...] = ()  # running jobs on this node (filled by the client when cheap)
    # when slurmd last reported a boot, as the backend prints it (compared, never parsed): a
    # new value after `scontrol reboot` is how the controller sees the node came back
    boot_time: str = ""

    @property
    def drained_or_draining(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def down(self) -> bool:
        return self.state == "DOWN"

    @property
    def not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.flags


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str = ""
    states: tuple[str, ...] = ()  # all state words, e.g. ("PENDING", "COMPLETING")
    state_reason: str = ""
    nodes: tuple[str, ...] = ()  # expanded hostlist
    batch_host: str = ""
    requeue: bool = True
    restart_count: int = 0
    admin_comment: str = ""
    comment: str = ""
    excluded_nodes: tuple[str, ...] = ()
    user: str = ""
    partition: str = ""
    work_dir: str = ""
    stdout: str = ""
    stderr: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """The primary state word (first of `states`)."""
        return self.states[0] if self.states else ""

    @property
    def running(self) -> bool:
        return "RUNNING" in self.states

    @property
    def pending(self) -> bool:
        # ["PENDING", "COMPLETING"] still runs down on the old node: not yet truly pending
        return "PENDING" in self.states and "COMPLETING" not in self.states


def each(nodes: Sequence[str], act: Callable[[str], None]) -> dict[str, SlurmError | None]:
    """`act` on every node in turn: per node None (done) or the SlurmError it raised, so one
    node's refusal never stops the others (the node-by-node form of drain_many/resume_many)."""
    out: dict[str, SlurmError | None] = {}
    for n in nodes:
        try:
            act(n)
            out[n] = None
        except SlurmError as exc:
            out[n] = exc
    return out


class SlurmClient:
    """Abstract interface. Every method has a bounded run time (config slurm.timeout_s)."""

    reason_prefix: str
    # whose automatic changes this client makes (slurm/ownership.py): the controller's
    # automation, or the HealthCheckProgram (`check --slurm-drain`), which changes only its own
    acting_as: ReasonOwner = ReasonOwner.AUTOMATIC

    def nodes(self) -> list[SlurmNode]:
        raise NotImplementedError

    def node(self, name: str) -> SlurmNode:
        raise NotImplementedError

    def jobs(self) -> list[SlurmJob]:
        raise NotImplementedError

    def topology(self) -> Topology:
        """Slurm's network topology (switches/blocks over nodes); empty when it has none."""
        raise NotImplementedError

    def job(self, job_id: int) -> SlurmJob:
        raise NotImplementedError

    def drain(self, node: str, reason: str) -> None:
        """Drain with `<prefix> <reason>`; SlurmNotOwned if already drained for someone else."""
        raise NotImplementedError

    def drain_many(self, nodes: Sequence[str], reason: str) -> dict[str, SlurmError | None]:
        """Drain several nodes with one reason: per node None (done) or its error. Backends
        that can re-check ownership and change them all in one Slurm call (one RPC)."""
        return each(nodes, lambda n: self.drain(n, reason))

    def resume_many(
        self, nodes: Sequence[str], manual: bool = False
    ) -> dict[str, SlurmError | None]:
        """Resume several of our drains: per node None (done or nothing to do) or its error.
        `manual`: an admin's resume, which may also take back any drain babysitter wrote."""
        return each(nodes, lambda n: self.resume(n, manual))

    def jobs_on(self, nodes: Collection[str]) -> list[SlurmJob]:
        """Jobs that have any of `nodes` (one job listing, filtered here: on 22.05
        `squeue -w` costs slurmctld a full node-info RPC on top of the job-info one)."""
        wanted = set(nodes)
        return [j for j in self.jobs() if wanted.intersection(j.nodes)]

    def resume(self, node: str, manual: bool = False) -> None:
        """Resume only the drains this client's mode wrote (`acting_as`; with `manual`, an
        admin's resume: any drain babysitter wrote); SlurmNotOwned otherwise."""
        raise NotImplementedError

    def requeue(self, job_id: int, exclude: list[str] | None = None, hold: bool = False) -> None:
        """Requeue; then add `exclude` (the faulty nodes) to ExcNodeList while it is pending.
        On Slurm 25.11+ a job submitted with `--requeue=expedite`, off nodes babysitter drained
        for a fault with nothing else on them, gets Slurm's expedited requeue instead (first in
        the queue, its old nodes kept for it: slurm/expedite.py)."""
        raise NotImplementedError

    def hold(self, job_id: int) -> None:
        raise NotImplementedError

    def release(self, job_id: int) -> None:
        raise NotImplementedError

    def start_validation(
        self, node: str, reservation: str, user: str, minutes: int, sbatch_args: list[str]
    ) -> int:
        """Run a validation job on a babysitter-drained NODE; returns its job id."""
        raise NotImplementedError

    def validation_outcome(self, job_id: int) -> tuple[str, str]:
        """(state, exit code) of a validation job."""
        raise NotImplementedError

    def cancel_job(self, job_id: int) -> None:
        """`scancel JOB`: end one of babysitter's own jobs (its validation job, recorded on the
        validate action: an admin took the node over, or its verdict is overdue). Never a
        user's job. A job already ended is fine; SlurmNotFound when Slurm forgot it."""
        raise NotImplementedError

    def reboot(self, node: str, reason: str, nextstate: str) -> None:
        """`scontrol reboot ASAP nextstate=... reason="<prefix> <reason>" NODE` on a node we
        drained: Slurm waits until it is empty, runs the RebootProgram and sees it boot.
        SlurmNotOwned if the node's reason is someone else's."""
        raise NotImplementedError

    def cancel_reboot(self, node: str) -> None:
        """`scontrol cancel_reboot NODE`: withdraw a reboot babysitter asked for that has not
        started yet (SlurmError when there is none to cancel or it is under way)."""
        raise NotImplementedError

    def reboot_program(self) -> str:
        """slurm.conf's RebootProgram ("" when none: `scontrol reboot` cannot complete)."""
        raise NotImplementedError

    def hold_for_validation(self, node: str, reservation: str, user: str, minutes: int) -> None:
        """A MAINT reservation on NODE so that, whatever state it comes back in from a
        reboot, no job but the validation job can start there."""
        raise NotImplementedError

    def end_validation(self, reservation: str) -> None:
        raise NotImplementedError

    def reserve_maintenance(self, name: str, nodes: list[str], user: str, minutes: int) -> None:
        """A MAINT reservation of `nodes` for `minutes` from now: no user job starts there."""
        raise NotImplementedError

    def end_maintenance(self, name: str) -> None:
        """Delete a maintenance reservation (gone already is fine)."""
        raise NotImplementedError

    # holds: a reservation that keeps jobs off idle nodes while babysitter tests them
    def hold_idle(self, name: str, nodes: Sequence[str], user: str, minutes: int) -> None:
        """Reserve NODES for `user` from now for `minutes`, refused (SlurmBusy) when a job
        holds any of them: Slurm checks that and creates the reservation in one RPC, so no job
        can start there between the check and the hold."""
        raise NotImplementedError

    def shrink_hold(self, name: str, nodes: Sequence[str]) -> None:
        """Keep only NODES in the hold (the others go back to Slurm); one RPC."""
        raise NotImplementedError

    def release_hold(self, name: str) -> None:
        """Delete the hold; one already gone is not an error."""
        raise NotImplementedError

    def holds(self, prefix: str) -> dict[str, tuple[str, ...]]:
        """Reservations whose name starts with `prefix`, with their nodes (one RPC)."""
        raise NotImplementedError
