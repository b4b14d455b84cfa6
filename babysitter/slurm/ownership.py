"""Whose a node's Slurm reason is: THE predicate. The Slurm client (before every change it
makes), the policy, admission, the healer, the validator, incidents, the HealthCheckProgram and
the API's views all ask `reason_owner`; none keeps its own copy of the marks.

babysitter writes `<prefix> <why>`. Without a mark it is babysitter's automation's (the policy's
drains, the healer's rungs, the validation's verdicts, incident drains). `<prefix> [manual] …`
is an admin's drain through babysitter, `<prefix> [healthcheck] …` the HealthCheckProgram's
(`babysitter check --slurm-drain`): each belongs to whoever wrote it, exactly like a reason
babysitter never wrote (foreign)."""

from __future__ import annotations

from enum import StrEnum

# an admin's drain through babysitter (`babysitter drain NODE`, rule manual): the admin's; only
# the admin's own resume takes it back, the policy never resumes it, no remediation rung runs
MANUAL_MARK = "[manual]"
# a drain of `babysitter check --slurm-drain` (HealthCheckProgram): only that check resumes it
HEALTHCHECK_MARK = "[healthcheck]"


class ReasonOwner(StrEnum):
    NONE = "none"  # no reason at all
    AUTOMATIC = "automatic"  # babysitter's automation (no mark)
    MANUAL = "manual"  # an admin through babysitter (`[manual]`)
    HEALTHCHECK = "healthcheck"  # the HealthCheckProgram (`[healthcheck]`)
    FOREIGN = "foreign"  # anything babysitter did not write: an admin in scontrol, NHC, Slurm


# reasons with babysitter's prefix, whoever of babysitter's modes wrote them
BABYSITTER_WRITTEN = frozenset({ReasonOwner.AUTOMATIC, ReasonOwner.MANUAL, ReasonOwner.HEALTHCHECK})


def _body(reason: str, prefix: str) -> str | None:
    """The reason after babysitter's prefix; None when it does not carry the prefix."""
    return reason[len(prefix) :].lstrip() if reason.startswith(prefix) else None


def mark_owner(text: str) -> ReasonOwner | None:
    """Who a reason's text (after the prefix) says wrote it, by its mark; None: no mark."""
    if text.startswith(MANUAL_MARK):
        return ReasonOwner.MANUAL
    if text.startswith(HEALTHCHECK_MARK):
        return ReasonOwner.HEALTHCHECK
    return None


def reason_owner(reason: str, prefix: str) -> ReasonOwner:
    """Whose a node's current Slurm reason is."""
    if not reason:
        return ReasonOwner.NONE
    body = _body(reason, prefix)
    if body is None:
        return ReasonOwner.FOREIGN
    return mark_owner(body) or ReasonOwner.AUTOMATIC


def automatic_reason(reason: str, prefix: str) -> bool:
    """The reason is one babysitter's automation wrote (not an admin's, not the check's)."""
    return reason_owner(reason, prefix) is ReasonOwner.AUTOMATIC


def automatic_body(reason: str, prefix: str) -> str | None:
    """The text of babysitter's automatic reason after the prefix (to tell which automatic
    step wrote it: a switch incident, a domain incident); None for anyone else's reason."""
    return _body(reason, prefix) if automatic_reason(reason, prefix) else None


def may_change(owner: ReasonOwner, actor: ReasonOwner) -> bool:
    """Whether `actor` may change a node whose reason is `owner`'s. Each of babysitter's
    modes changes only its own reasons; an admin's request through babysitter (MANUAL) also
    any reason babysitter wrote (the admin decides). A foreign reason, or none (nothing
    babysitter drained), is nobody's to change here."""
    if owner in (ReasonOwner.NONE, ReasonOwner.FOREIGN):
        return False
    if actor is ReasonOwner.MANUAL:
        return owner in BABYSITTER_WRITTEN
    return owner is actor
