"""The end of a remediation episode someone else took over: an admin drained the node (through
`babysitter drain`, which writes `[manual]`, or in Slurm) while babysitter was waiting to act,
rebooting, resetting or validating it. What babysitter had set in motion is withdrawn (a
pending `scontrol reboot`, a running validation job, the validation reservation, that
validation's verdict), the
episode is closed and recorded, and the node is never touched again by this episode: only a
new babysitter drain starts another one."""

from __future__ import annotations

import logging
from datetime import datetime

from babysitter.controller.db import audit
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.store import Store
from babysitter.controller.loop.admit.gate import AdmittedSlurm
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.heal.validation import cancel_validation_job, reservation_name
from babysitter.controller.loop.read.ledger import Ledger, Phase, Remediation
from babysitter.slurm.client import SlurmClient, SlurmError, SlurmNode

log = logging.getLogger(__name__)


def cancel_pending_reboot(slurm: SlurmClient, rem: Remediation) -> str:
    """Withdraw the reboot babysitter asked for, if it has not happened yet; what was done."""
    if rem.state is not Phase.REBOOTING or "booted_at" in rem.evidence:
        return ""
    try:
        AdmittedSlurm(slurm).cancel_reboot(rem.node)  # babysitter's own request
    except SlurmError as exc:
        return f"reboot not cancelled ({exc})"
    return "pending reboot cancelled"


def end_taken_over(
    store: Store, slurm: SlurmClient, rem: Remediation, sn: SlurmNode, now: datetime
) -> None:
    """Close `rem`: the node carries someone else's reason (sn.reason)."""
    aid = rem.evidence.get("validation_action")
    action = store.action(int(aid)) if rem.state is Phase.VALIDATING and aid else None
    cancelled = ""
    if (
        action is not None
        and action.kind is ActionKind.VALIDATE
        and action.node == rem.node
        and action.status is ActionStatus.RUNNING
    ):
        # before the reservation goes: the job must not go on stressing the admin's node
        cancelled = cancel_validation_job(slurm, action.job_id)
    done = [cancel_pending_reboot(slurm, rem), cancelled]
    if rem.state in (Phase.REBOOTING, Phase.VALIDATING):
        try:
            AdmittedSlurm(slurm).end_validation(reservation_name(rem.node))
            done.append("validation reservation ended")
        except SlurmError as exc:
            done.append(f"validation reservation not ended ({exc})")
    if rem.state is Phase.VALIDATING and aid:
        # its verdict must not drain, resume or re-reason the admin's node when it comes
        store.update_action(
            aid,
            status=ActionStatus.SKIPPED,
            done_at=now,
            outcome="; ".join(filter(None, ("node taken over by an admin", cancelled))),
        )
        audit.record_actions(store, [aid], now)
    why = f"taken over by an admin while {rem.state.value} (reason {sn.reason[:200]!r})"
    outcome = "; ".join([why, *(d for d in done if d)])
    Ledger(store).move(rem, Phase.TAKEN_OVER, now, outcome)
    kind = ActionKind(rem.rung.value)
    rid = store.record_action(
        kind,
        node=rem.node,
        reason=rem.fault[:1000],
        rule=Rule.REMEDIATION,
        requested_by="policy",
        status=ActionStatus.SKIPPED,
        outcome=f"{outcome} (ledger row {rem.id})"[:1000],
    )
    audit.record_actions(store, [rid], now)
    log.warning("%s: remediation episode ended: %s", rem.node, outcome)
