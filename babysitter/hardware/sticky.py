"""Which event findings stay open after they were reported, and why (a table, opt-in).

An event (an NVML event, an XID in the kernel log) is said once; the agent keeps a few of them
open in every later report until a reboot or a GPU reset (agent/sticky.py, the kernel-log check
checks/xid/check.py). Kept without a reason, every application XID stayed a warning until a
reboot and after a week every node showed one. So a finding stays only where this table states
why the fault outlives its event; the reason rides in the finding's details (`sticky_reason`),
so on-call can see why it is still open. Anything else is reported once (its event report)
and not kept. Every critical, drain-worthy event finding is in the table: it stays until its
remedy (the reset or reboot it asks for) is done.
"""

from __future__ import annotations

from babysitter.finding import Finding, Severity

REASON_KEY = "sticky_reason"

# finding code -> why it stays until a reboot or reset
BY_CODE: dict[str, str] = {
    "gpu.fallen_off_bus": "the GPU is off the bus until a reboot",
    "gpu.lost": "NVML lost the GPU: it is gone until a reboot",
    "gpu.unavailable": "NVML marks the GPU unavailable until a reboot",
    "ecc.dbe.event": (
        "an uncorrectable ECC error stands until a GPU reset clears the volatile counters "
        "(ended sooner when gpu.memory reads the memory healthy)"
    ),
    "poison.fatal": "fatal poisoned memory stays until the GPU is reset",
    "retirement.failed": (
        "a page that could not be retired stays bad until a GPU reset retires it (ended sooner "
        "when gpu.memory reads the memory healthy)"
    ),
    "gpu.recovery_action": "the driver asked for a recovery: it stands until the GPU is reset",
    "recovery.gpu_reset": "the driver asks for a GPU reset: it stands until the GPU is reset",
    "recovery.drain_and_reset": "the driver asks for a drain and reset: until the GPU is reset",
    "recovery.bus_reset": "the driver asks for a bus reset: it stands until the GPU is reset",
    "recovery.node_reboot": "the driver asks for a node reboot: it stands until a reboot",
    "recovery.system_reboot": "the driver asks for a system reboot: it stands until a reboot",
    "recovery.drain_p2p": "the driver asks to drain P2P: it stands until a reset or reboot",
    "recovery.recover_imex_domain": (
        "the driver asks to recover the IMEX domain: it stands until a reset or reboot"
    ),
}
# an XID's class (hardware/xids.py: the catalog, or the site's override) -> why it stays
BY_XID_CLASS: dict[str, str] = {
    "reboot": "NVIDIA's catalog asks for a node reboot: the fault stands until one",
    "reset_gpu": "NVIDIA's catalog asks for a GPU reset: the fault stands until the GPU is reset",
    "recovery": "XID 154: the driver's recovery action stands until it is carried out",
}
# the same, in this XID's own words, where it says more than its class
BY_XID: dict[int, str] = {
    79: "the GPU is off the bus until a reboot",
    48: "a double-bit ECC error stands until a GPU reset clears the volatile counters",
    74: "an NVLink error stands until the GPU is reset (or the node rebooted)",
}
# the kernel log's XIDs that an application caused: open while their job runs on this node
JOB_REASON = "caused by a job's application: open until that job no longer runs on this node"


def reason(f: Finding) -> str | None:
    """Why `f` stays open after its event; None: reported once, not kept. A job's fault is
    never kept until a reboot (the kernel-log check ends it with its job: JOB_REASON)."""
    if f.severity < Severity.WARNING or f.details.get("job_attributable"):
        return None
    if f.code in BY_CODE:
        return BY_CODE[f.code]
    klass = f.details.get("class")
    if not isinstance(klass, str) or klass not in BY_XID_CLASS:
        return None
    xid = f.details.get("xid")
    return BY_XID.get(xid, BY_XID_CLASS[klass]) if isinstance(xid, int) else BY_XID_CLASS[klass]


def with_reason(f: Finding, why: str) -> Finding:
    if f.details.get(REASON_KEY) == why:
        return f
    return f.replace(details={**f.details, REASON_KEY: why})


def mark(f: Finding) -> Finding:
    """`f` with its reason to stay in its details, where the table gives one."""
    why = reason(f)
    return f if why is None else with_reason(f, why)
