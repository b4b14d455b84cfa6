"""The alert every sink renders, and what on-call should do for each condition."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from babysitter.finding import Severity

# condition -> what on-call should do (shown in every alert; docs/operations.md has a section
# for each, with the same advice at more length)
RUNBOOK: dict[str, str] = {
    "node_unhealthy": "Check the finding: XID 79 / GPU lost -> reboot the node and reseat the GPU "
    "if it repeats; DBE / row remap pending -> reset the GPU (nvidia-smi -r) or reboot; row "
    "remap failure / retired page limit -> RMA the GPU. babysitter resumes the node itself "
    "after clean checks.",
    "node_unhealthy_not_ours": "The node is held by another reason (an admin drain): decide "
    "yourself; babysitter will not touch it.",
    "node_unknown": "The agent stopped reporting: check the node is up, `systemctl status "
    "babysitter-agent`, and network to the controller.",
    "config_reload_failed": "A configuration reload (systemctl reload, SIGHUP) found an invalid "
    "file and kept the previous configuration: `babysitter config check`, fix it, reload again.",
    "guard_tripped": "Many nodes failed at once: suspect fabric, power, cooling or a bad "
    "driver/firmware roll-out rather than GPUs. Investigate, then `babysitter guard reset` "
    "(POST /api/v1/guard/reset) to let babysitter drain again.",
    "lemon_node": "This node keeps failing: take it out for hardware diagnostics / RMA.",
    "validation_failed": "The node failed its validation job after its fault cleared: read the "
    "reason (SDC mismatch, ECC or throttling under stress, NCCL), reset or reboot it; babysitter "
    "validates it again after clean reports.",
    "validation_lemon": "The node failed validation validation.max_attempts times: diagnostics / "
    "RMA, then `babysitter resume NODE`.",
    "rma_evidence": "RMA evidence for the node (bug report, kernel log, ledger, findings): "
    "download the archive from the link for the vendor's RMA case; if it could not be "
    "collected, run nvidia-bug-report.sh on the node by hand (docs/operations.md#rma_evidence).",
    "node_slow": "A straggler: this node computes or communicates well below its GPU model's "
    "fleet median. Check clocks, power capping, thermals and PCIe/NVLink link width.",
    "job_requeue_limit": "The job hit max_requeues and is held: look at its log and nodes, "
    "then `scontrol release` it or cancel it.",
    "switch_suspected": "Several nodes under one switch lost the fabric together: check the "
    "switch (its ports, power, the subnet manager's log: `ibswitches`, `ibdiagnet`) rather than "
    "the nodes. babysitter resumes the nodes together once their ports are back and clean.",
    "nvlink_domain_suspected": "Several nodes of one NVLink domain (an NVL72 rack) lost their "
    "NVLink fabric together: check the rack's NVLink switch trays and their Fabric Manager "
    "(NVOS), IMEX on the compute trays (`nvidia-imex-ctl -N`), and the rack's power and cooling "
    "rather than the nodes. babysitter resumes the nodes together once each reports clean.",
    "blast_radius_cap": "A scope ([blast_radius]) holds its cap of drained nodes: new faults "
    "there stay in service. Find what the scope's nodes share (rack, PDU, cooling, a roll-out); "
    "drain by hand what must go. Resumes free room; nothing needs a reset.",
    "job_hung": "The job made no progress within its hang_timeout while its GPUs were idle: "
    "check its log (NCCL hang?).",
}
DEFAULT_RUNBOOK = "Look at `babysitter findings <node>` and the node's kernel log."

# Who an alert is for. "oncall": the cluster's operators (their chat, their pager). "job": the
# job's owner (its Slurm user, the `owner` label), or a channel the site names for job alerts:
# a line a user's job printed into its own log (policy.JOB_ALERT_PREFIX) is about that job,
# never a page (docs/operations.md#routes)
ONCALL, JOB = "oncall", "job"
JOB_CONDITION_PREFIX = "job_log_"


def runbook(condition: str) -> str:
    if condition.startswith("switch_suspected_"):
        return RUNBOOK["switch_suspected"]
    if condition.startswith("nvlink_domain_suspected_"):
        return RUNBOOK["nvlink_domain_suspected"]
    if condition.startswith("job_hung"):
        return RUNBOOK["job_hung"]
    if condition.startswith("job_requeue_limit"):
        return RUNBOOK["job_requeue_limit"]
    if condition.startswith("xid_") and condition.endswith("_repeated"):
        return "The same fatal XID keeps coming back on one GPU: hardware inspection / RMA."
    return RUNBOOK.get(condition, DEFAULT_RUNBOOK)


@dataclass
class Alert:
    node: str | None  # None: cluster-wide
    condition: str  # stable name: node_unhealthy, guard_tripped, lemon_node, ...
    severity: Severity
    summary: str  # what happened
    action_taken: str  # what babysitter did
    starts_at: datetime
    resolved: bool = False
    ends_at: datetime | None = None
    nodes: list[str] = field(default_factory=list)  # grouped alerts: every node
    details: dict[str, object] = field(default_factory=dict)
    # a job alert's owner: the job's Slurm user (the router fills it from the job listing)
    owner: str | None = None

    def __post_init__(self) -> None:
        # a severity given as text is read as the enum (a misspelled one raises here, where it
        # was made, not as a silently unrouted alert)
        self.severity = Severity(self.severity)

    @property
    def route(self) -> str:
        return JOB if self.condition.startswith(JOB_CONDITION_PREFIX) else ONCALL

    @property
    def job_id(self) -> str | None:
        """The job a job-route alert is about (its condition names it)."""
        return self.condition.removeprefix(JOB_CONDITION_PREFIX) if self.route == JOB else None

    @property
    def key(self) -> str:
        return f"{self.node or 'cluster'}|{self.condition}"

    @property
    def todo(self) -> str:
        return runbook(self.condition)

    @property
    def title(self) -> str:
        state = "RESOLVED" if self.resolved else self.severity.upper()
        where = self.node or (f"{len(self.nodes)} nodes" if self.nodes else "cluster")
        return f"[{state}] babysitter {self.condition} on {where}"

    def text(self) -> str:
        lines = [
            self.title,
            f"What happened: {self.summary}",
            f"What babysitter did: {self.action_taken}",
        ]
        if self.owner:
            lines.append(f"Job owner: {self.owner}")
        if not self.resolved:
            lines.append(f"What to do: {self.todo}")
        return "\n".join(lines)
