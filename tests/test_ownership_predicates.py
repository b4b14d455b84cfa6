"""The two ownership predicates (issue 49, deliverable 1), each tested once as a table, and
asked of every module that decides with it: whose a node's Slurm reason is
(slurm/ownership.py `reason_owner`) and whether a finding is a job's own evidence
(finding.py `job_owned`). A module that kept its own copy and disagreed shows up as a row."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from babysitter.controller.api.cockpit_metrics import owner as metrics_owner
from babysitter.controller.api.fleet_view import reason_owner as fleet_owner
from babysitter.controller.loop.admit.admission import Act, Limits, World, decide_admission
from babysitter.controller.loop.decide.node.verdict import drain_worthy, node_verdict
from babysitter.controller.loop.decide.ownership import Owner, episode_owner
from babysitter.controller.loop.sdc.due import slurm_why_not
from babysitter.finding import Action, Finding, Severity, job_owned
from babysitter.slurm.base import OwnedClient
from babysitter.slurm.client import SlurmNode
from babysitter.slurm.ownership import (
    ReasonOwner,
    automatic_body,
    automatic_reason,
    may_change,
    reason_owner,
)
from babysitter.slurm.topology import tree

P = "babysitter:"
A, M, H, F, N = (
    ReasonOwner.AUTOMATIC,
    ReasonOwner.MANUAL,
    ReasonOwner.HEALTHCHECK,
    ReasonOwner.FOREIGN,
    ReasonOwner.NONE,
)

# (the node's Slurm reason, whose it is)
REASONS = [
    ("", N),
    ("babysitter: gpu.xid: XID 79 on GPU 3 (reboot: node fault)", A),
    ("babysitter: switch leaf1 suspected", A),
    ("babysitter: validation failed: dcgm diag level 2", A),
    ("babysitter:gpu.ecc: DBE", A),  # no space after the prefix: still babysitter's
    ("babysitter: text that names [manual] later on", A),  # a mark counts only in front
    ("babysitter: [manual] swap the fan", M),
    ("babysitter:   [manual] swap the fan", M),
    ("babysitter: [healthcheck] gpu.memory: GPU 3: 1 volatile DBE", H),
    ("babysitter:[healthcheck] gpu.memory", H),
    ("admin maintenance", F),
    ("NHC: check_hw_gpu: GPU 3 missing", F),
    ("Not responding", F),
    ("Kill task failed", F),
    (" babysitter: gpu.xid", F),  # not at the start: not babysitter's text
    ("babysitter2: gpu.xid", F),  # another instance's prefix
    ("BABYSITTER: gpu.xid", F),
]


@pytest.mark.parametrize(("reason", "owner"), REASONS)
def test_whose_reason_it_is(reason: str, owner: ReasonOwner):
    assert reason_owner(reason, P) is owner
    assert automatic_reason(reason, P) is (owner is A)
    assert (automatic_body(reason, P) is not None) is (owner is A)


# (whose the reason is, who asks for a change, may it change it)
MATRIX = [
    (A, A, True),
    (M, A, False),
    (H, A, False),
    (F, A, False),
    (N, A, False),  # nothing babysitter drained: not its to resume
    (A, H, False),  # the check never takes over the controller's drain
    (M, H, False),
    (H, H, True),
    (F, H, False),
    (A, M, True),  # an admin's request through babysitter: any reason babysitter wrote
    (M, M, True),
    (H, M, True),
    (F, M, False),  # never an admin's reason in scontrol, nor NHC's
    (N, M, False),
]


@pytest.mark.parametrize(("owner", "actor", "allowed"), MATRIX)
def test_who_may_change_whose_reason(owner: ReasonOwner, actor: ReasonOwner, allowed: bool):
    assert may_change(owner, actor) is allowed


class _Client(OwnedClient):
    """OwnedClient over one node held in memory."""

    def __init__(self, reason: str, acting_as: ReasonOwner = A) -> None:
        super().__init__(P)
        self.acting_as = acting_as
        self.node_ = SlurmNode("n1", "IDLE", frozenset({"DRAIN"}), reason)

    def nodes(self) -> list[SlurmNode]:
        return [self.node_]


def _world(sn: SlurmNode) -> World:
    return World(nodes={"n1": sn}, held=(), topology=tree({"leaf1": ["n1"]}), prefix=P)


@pytest.mark.parametrize(("reason", "owner"), REASONS)
def test_every_module_reads_the_reason_the_same_way(reason: str, owner: ReasonOwner):
    """The Slurm client (the controller's and the HealthCheckProgram's), admission, the
    healer's episode, the SDC re-test and the API's views, row by row."""
    sn = SlurmNode("n1", "IDLE", frozenset({"DRAIN"}), reason)
    assert _Client(reason).owns(sn) is (owner is A)
    assert _Client(reason, acting_as=H).owns(sn) is (owner is H)
    assert _Client(reason).owns(sn, manual=True) is (owner in (A, M, H))
    for act in (Act.RESUME, Act.REBOOT, Act.RESET_GPU, Act.VALIDATE, Act.DRAIN):
        refused = decide_admission(act, ["n1"], _world(sn), Limits())["n1"]
        allowed = owner is A or (owner is N and act is Act.DRAIN)
        assert (refused is None) is allowed, (act, refused)
    assert episode_owner(sn, P) is (Owner.AUTOMATIC if owner in (A, N) else Owner.OTHER)
    idle = SlurmNode("n1", "IDLE", frozenset({"DRAIN"}), reason)
    assert (slurm_why_not(idle, retest=True, prefix=P) == "") is (owner is A)
    label = {A: "babysitter", M: "admin", H: "healthcheck", F: "admin", N: "none"}[owner]
    assert fleet_owner(reason, False, P) == label
    assert metrics_owner(False, "", reason, P) == {M: "admin", F: "other", N: "other"}.get(
        owner, "babysitter"
    )


AT = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _f(check: str, component: str, code: str, sev: Severity = Severity.CRITICAL) -> Finding:
    return Finding(
        check=check,
        component=component,
        severity=sev,
        code=code,
        message="m",
        action=Action.INSPECT,
        observed_at=AT,
    )


# (a finding, is it a job's own evidence)
FINDINGS = [
    (_f("nccl.logs", "job:4242", "nccl.watchdog_timeout"), True),
    (_f("nccl.logs", "host", "nccl.watchdog_timeout"), True),  # the job-log check's reading
    (_f("nccl.logs", "host", "nccl.logs_skipped", Severity.WARNING), False),  # about the node
    (_f("babysitter.ingest", "job:4242", "ingest.findings_folded"), True),  # a job-owned fold
    (_f("babysitter.ingest", "job:several", "ingest.findings_folded"), True),
    (_f("babysitter.ingest", "host", "ingest.findings_folded"), False),  # the node's own fold
    (_f("xid.nvml", "gpu3", "xid.79"), False),
    (_f("gpu.memory", "gpu0", "ecc.dbe.volatile"), False),
    (_f("ib.link", "ib:mlx5_0/1", "ib.link_down"), False),
    (_f("check", "host", "check.timeout"), False),
]


@pytest.mark.parametrize(("f", "owned"), FINDINGS)
def test_whose_evidence_a_finding_is(f: Finding, owned: bool):
    assert job_owned(f) is owned
    assert job_owned(f.to_json_dict()) is owned  # the stored form the ingest folds
    # and what the policy makes of it: a job's critical never drains, never makes the node
    # unhealthy; the node's own critical does
    critical = f.severity is Severity.CRITICAL
    assert drain_worthy(f) is (critical and not owned)
    verdict, _ = node_verdict([f], 1.0, 60.0)
    assert verdict == ("healthy" if owned else "unhealthy" if critical else "suspect")
