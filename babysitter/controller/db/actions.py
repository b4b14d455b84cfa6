"""What babysitter does to a node or a job, as one type from the decision to its outcome: a row
of the actions table. The store reads rows into `Action`s at its boundary (store.py:
stored_kind, stored_status) and records them; the executor, the healer, validation, the jobs
and the API read their fields, never a dict of columns."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import datetime
from enum import StrEnum
from typing import Any


class ActionKind(StrEnum):
    DRAIN = "drain"  # out of service (policy, admin, validation, a switch incident)
    RESUME = "resume"  # back in service
    REQUEUE_JOBS = "requeue_jobs"  # a drain's follow-up: one `requeue` per babysat job there
    REQUEUE = "requeue"  # one job, from its last checkpoint when it is babysat
    GUARD = "guard"  # the blast-radius breaker tripped (recorded done)
    GUARD_RESET = "guard_reset"  # an admin re-arms the breaker
    VALIDATE = "validate"  # a validation job before the node returns
    LEDGER_CLEAR = "ledger_clear"  # an admin clears a node's remediation history
    # the remediation ladder's rungs (controller/ladder.py) and the lemon ledger's verdict
    RESET_GPU = "reset_gpu"
    RESTART_FABRIC = "restart_fabric"  # nvidia-fabricmanager / nvidia-imex, by the agent
    REBOOT = "reboot"
    INSPECT = "inspect"
    RMA = "rma"
    LEMON = "lemon"
    # RMA evidence collected from the node's agent (controller/loop/heal/rma.py): running -> done
    EVIDENCE = "rma_evidence"
    # a word in the database that no kind above reads (hand-written, another version): it is
    # shown, never executed (a pending one fails) and never counted as a drain
    UNKNOWN = "unknown"


class ActionStatus(StrEnum):
    PENDING = "pending"  # waits for the executor (or its retry)
    RUNNING = "running"  # a validation job is running
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"  # not ours to change (another owner's drain)


@dataclass(frozen=True)
class Action:
    """One action. `id` 0: not recorded yet (the store gives it its id)."""

    kind: ActionKind
    node: str | None = None
    job_id: int | None = None
    reason: str | None = None
    rule: str | None = None  # a policy.Rule when recorded now; older rows may name another
    requested_by: str = "policy"
    status: ActionStatus = ActionStatus.PENDING
    outcome: str | None = None
    dry_run: bool = False
    attempts: int = 0
    created_at: datetime | None = None
    done_at: datetime | None = None
    next_attempt_at: datetime | None = None
    id: int = 0

    def columns(self) -> dict[str, Any]:
        """The row to insert (the store sets the id)."""
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "id"}
        row["kind"], row["status"] = str(self.kind), str(self.status)
        return row

    def to_json(self) -> dict[str, Any]:
        """What the API shows: every column, under its column name."""
        return {"id": self.id, **self.columns()}

    def created(self, at: datetime) -> Action:
        """As recorded at `at`: created then, its first attempt due then, and done then unless
        it is pending."""
        done = None if self.status == ActionStatus.PENDING else at
        return replace(self, attempts=0, created_at=at, done_at=done, next_attempt_at=at)

    def recorded(self, action_id: int) -> Action:
        return replace(self, id=action_id)

    @property
    def is_policy_drain_done(self) -> bool:
        """A drain the policy decided and Slurm carried out: what the drain budget and the
        lemon count count, and where a node's validation history starts again."""
        return (
            self.kind is ActionKind.DRAIN
            and self.status is ActionStatus.DONE
            and self.requested_by == "policy"
        )

    @property
    def manual(self) -> bool:
        """An admin's request (rule `manual`): a drain of it is never resumed by the policy."""
        return self.rule == "manual"
