"""The one door through which the controller changes Slurm (issue 49, deliverable 2).

Every changing method of the Slurm client (slurm/client.py) is classified below. A node change
(a drain, a resume, a reboot, a validation job that resumes the node in its reservation) asks
the admission step (controller/loop/admit/admission.py) right before it goes to Slurm, for that act
on those nodes; refused, it is not sent: `Held`, a SlurmError carrying the admission's reason,
counted and paged like every refusal (`admission_held`). Callers handle it as a change Slurm
refused: the node stays as it is; the incident steps and the healer ask again next tick. A job
change (a requeue) or a change of babysitter's own objects (its reservations, its validation
job, a reboot it asked for) passes through unasked: none of them takes a node from anyone.

Controller modules read Slurm through their client and change it only through an
`AdmittedSlurm`; the executor (controller/loop/act/executor.py, which asks admission per action
itself) and this module are the only callers of the client's changing methods. Agent orders
(GPU reset, fabric restart, RMA collection) are issued only by
controller/loop/admit/order_permission.py, after their permission was asked. (An SDC test order,
sdc_schedule.py, changes nothing of its node: it runs only inside babysitter's own hold, which
Slurm refuses where a job runs.) tests/test_admission_is_the_only_door.py reads the code and
fails naming file:line where a module goes around this door."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum

from babysitter.controller.loop.admit.admission import Act, Admission, Refusal
from babysitter.slurm.client import SlurmClient, SlurmError


class Change(StrEnum):
    NODE = "node"  # changes a node's state or reason: the admission step asks first
    JOB = "job"  # changes a user's job (its queue place, its nodes), never a node
    OWN = "own"  # babysitter's own object: its reservation, validation job, reboot request
    RAW = "raw"  # below the client's interface: never called from the controller


# every method of the Slurm client that changes Slurm, what it changes and the act admission
# is asked for. The executor (controller/loop/act/executor.py) calls them after its own admission.
SLURM_CHANGES: dict[str, tuple[Change, Act | None]] = {
    "drain": (Change.NODE, Act.DRAIN),  # a new drain or a re-reason of our own
    "drain_many": (Change.NODE, Act.DRAIN),
    "resume": (Change.NODE, Act.RESUME),
    "resume_many": (Change.NODE, Act.RESUME),
    "reboot": (Change.NODE, Act.REBOOT),
    "hold_for_validation": (Change.NODE, Act.REBOOT),  # a reboot's reservation, made with it
    "start_validation": (Change.NODE, Act.VALIDATE),  # resumes the node inside its reservation
    "cancel_reboot": (Change.OWN, None),  # withdraws a reboot babysitter asked for
    "end_validation": (Change.OWN, None),  # deletes babysitter's validation reservation
    "cancel_job": (Change.OWN, None),  # babysitter's own validation job, by its recorded id
    "hold_idle": (Change.OWN, None),  # SDC test holds: Slurm refuses where a job runs
    "shrink_hold": (Change.OWN, None),
    "release_hold": (Change.OWN, None),
    "reserve_maintenance": (Change.OWN, None),  # an admin's window: takes nodes from automation
    "end_maintenance": (Change.OWN, None),
    "requeue": (Change.JOB, None),  # a babysat job off its faulty nodes
    "hold": (Change.JOB, None),
    "release": (Change.JOB, None),
    "exclude": (Change.JOB, None),
    "create_reservation": (Change.RAW, None),
    "delete_reservation": (Change.RAW, None),
    "sbatch": (Change.RAW, None),
    "run": (Change.RAW, None),  # any scontrol command line
}
# names other objects use too (a lock's release, a thread's run): a call is the client's only
# where its receiver names the client
GENERIC = frozenset({"hold", "release", "exclude", "run", "sbatch"})
# what a batch change sends to Slurm for the nodes admitted
Send = Callable[[list[str]], Mapping[str, SlurmError | None]]


class Held(SlurmError):
    """The admission step held this change: not sent to Slurm, asked again later."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


class AdmittedSlurm:
    """A Slurm client's changes, each node change admitted first. Without an admission step
    (a unit test's module on its own) the changes pass straight through."""

    def __init__(self, slurm: SlurmClient, admission: Admission | None = None) -> None:
        self._slurm = slurm
        self._admission = admission

    def _ask(
        self, act: Act, nodes: Sequence[str], now: datetime, switch_incident: bool = False
    ) -> dict[str, Refusal | None]:
        """Per node the admission's refusal, or None: admitted (against the tick's listing)."""
        if self._admission is None or not nodes:
            return dict.fromkeys(nodes)
        return self._admission.check(act, nodes, now, switch_incident=switch_incident)

    def _one(self, act: Act, node: str, now: datetime) -> None:
        """One node's reboot or validation, on its state read from Slurm right now."""
        if self._admission is not None and (held := self._admission.one(act, node, now)):
            raise Held(held)

    def _many(
        self, act: Act, nodes: Sequence[str], now: datetime, switch_incident: bool, send: Send
    ) -> dict[str, SlurmError | None]:
        got = self._ask(act, nodes, now, switch_incident)
        out: dict[str, SlurmError | None] = {n: Held(r) for n, r in got.items() if r}
        todo = [n for n in nodes if n not in out]
        if todo:
            try:
                out.update(send(todo))
            except SlurmError as exc:
                out.update(dict.fromkeys(todo, exc))
        return {n: out.get(n) for n in nodes}

    # ---- node changes: admitted first
    def drain(self, node: str, reason: str, now: datetime) -> None:
        if r := self._ask(Act.DRAIN, [node], now)[node]:
            raise Held(r)
        self._slurm.drain(node, reason)

    def resume(self, node: str, now: datetime) -> None:
        if r := self._ask(Act.RESUME, [node], now)[node]:
            raise Held(r)
        self._slurm.resume(node)

    def drain_many(
        self, nodes: Sequence[str], reason: str, now: datetime, switch_incident: bool = False
    ) -> dict[str, SlurmError | None]:
        """Per node None (drained), Held (not sent) or Slurm's error."""
        return self._many(
            Act.DRAIN, nodes, now, switch_incident, lambda t: self._slurm.drain_many(t, reason)
        )

    def resume_many(self, nodes: Sequence[str], now: datetime) -> dict[str, SlurmError | None]:
        return self._many(Act.RESUME, nodes, now, False, self._slurm.resume_many)

    def reboot(
        self, node: str, reason: str, nextstate: str, hold: tuple[str, str, int], now: datetime
    ) -> None:
        """The validation reservation `hold` (name, user, minutes) first, so the node never
        comes back open to jobs, then `scontrol reboot`: one admission for both."""
        self._one(Act.REBOOT, node, now)
        self._slurm.hold_for_validation(node, *hold)
        self._slurm.reboot(node, reason, nextstate)

    def start_validation(
        self, node: str, reservation: str, user: str, minutes: int, argv: list[str], now: datetime
    ) -> int:
        self._one(Act.VALIDATE, node, now)
        return self._slurm.start_validation(node, reservation, user, minutes, argv)

    # ---- babysitter's own objects and users' jobs: no node is taken from anyone
    def cancel_reboot(self, node: str) -> None:
        self._slurm.cancel_reboot(node)

    def end_validation(self, reservation: str) -> None:
        self._slurm.end_validation(reservation)

    def cancel_job(self, job_id: int) -> None:
        self._slurm.cancel_job(job_id)

    def hold_idle(self, name: str, nodes: Sequence[str], user: str, minutes: int) -> None:
        self._slurm.hold_idle(name, nodes, user, minutes)

    def shrink_hold(self, name: str, nodes: Sequence[str]) -> None:
        self._slurm.shrink_hold(name, nodes)

    def release_hold(self, name: str) -> None:
        self._slurm.release_hold(name)

    def reserve_maintenance(self, name: str, nodes: list[str], user: str, minutes: int) -> None:
        self._slurm.reserve_maintenance(name, nodes, user, minutes)

    def end_maintenance(self, name: str) -> None:
        self._slurm.end_maintenance(name)

    def requeue(self, job_id: int, exclude: list[str] | None = None, hold: bool = False) -> None:
        self._slurm.requeue(job_id, exclude=exclude, hold=hold)
