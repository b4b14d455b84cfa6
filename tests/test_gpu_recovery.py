"""Follow the driver (issue 41): each GPU's recovery action (NVML field 230, else the older
reset-status fields 226/227) and XID 154's text become typed findings, and each action maps to
its rung of the remediation ladder. The check runs through the real pynvml binding over the
fake libnvidia-ml."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from babysitter.checks.xid.check import EVENT_RECOVERY_ACTION, parse_kmsg_line, xid_finding
from babysitter.config import parse_config
from babysitter.controller.loop.decide.ladder import LadderTable, Rung, fault_class, remediable
from babysitter.controller.loop.decide.node.verdict import drain_worthy
from babysitter.controller.loop.heal.fabric_rung import units_for
from babysitter.finding import Action, Finding, Severity
from babysitter.hardware.recovery import RecoveryAction, from_reset_status, parse_xid154
from babysitter.hardware.xids import classify
from tests.fixtures.gpu import babysitter_env, run_babysitter

# what each action must become: the finding's recommended action, and the ladder's first rung
# (None: no rung, the node stays drained for a human with the action named in its reason)
EXPECTED: dict[RecoveryAction, tuple[Action, Rung | None]] = {
    RecoveryAction.GPU_RESET: (Action.RESET_GPU, Rung.RESET_GPU),
    RecoveryAction.NODE_REBOOT: (Action.REBOOT, Rung.REBOOT),
    RecoveryAction.DRAIN_P2P: (Action.DRAIN, None),
    RecoveryAction.DRAIN_AND_RESET: (Action.RESET_GPU, Rung.RESET_GPU),
    RecoveryAction.RECOVER_IMEX_DOMAIN: (Action.DRAIN, Rung.RESTART_FABRIC),
    RecoveryAction.BUS_RESET: (Action.RESET_GPU, Rung.RESET_GPU),
    RecoveryAction.SYSTEM_REBOOT: (Action.REBOOT, Rung.REBOOT),
}


def _check(env: dict[str, str]) -> list[dict]:
    r = run_babysitter(env, "check", "--json", "--only", "gpu.recovery")
    assert "Traceback" not in r.stderr, r.stderr
    return [f for f in json.loads(r.stdout) if f["check"] == "gpu.recovery"]


def test_each_recovery_action_is_a_typed_finding_on_its_gpu(gpus, fakenvml_lib, tmp_path):
    """GPU N asks for action N (0 none ... 7 system reboot): one finding per GPU that needs
    something, its action typed in the details (the number, not words to parse)."""
    for a in RecoveryAction:
        gpus.recovery(int(a), int(a))
    findings = _check(babysitter_env(gpus, fakenvml_lib, tmp_path))
    by_gpu = {f["component"]: f for f in findings}
    assert by_gpu["gpu0"]["severity"] == "ok"  # none: nothing to do
    for a, (action, _) in EXPECTED.items():
        f = by_gpu[f"gpu{int(a)}"]
        assert (f["severity"], f["action"], f["code"]) == ("critical", action.value, a.code)
        assert f["details"]["recovery_action"] == int(a)
        assert f["details"]["source"] == "recovery_action"
        assert a.label in f["message"] or a.reason in f["message"]
    assert "P2P" in by_gpu["gpu3"]["message"] and "IMEX" in by_gpu["gpu5"]["message"]


def test_older_drivers_and_failed_reads(gpus, fakenvml_lib, tmp_path):
    """A driver before field 230 answers the reset-status fields (reset required -> GPU reset,
    drain and reset -> drain and reset); one with neither says so (info, not ok); a read that
    fails, or a value no table knows, is unknown: a warning, never ok."""
    gpus.recovery(0, None, fields=1).reset_status(0, reset=1)
    gpus.recovery(1, None, fields=1).reset_status(1, drain_and_reset=1)
    gpus.recovery(2, None, fields=1)
    gpus.recovery(3, None, fields=0)
    gpus.recovery(4, None, rc=999)  # NVML_ERROR_UNKNOWN on the field
    gpus.recovery(5, 42)
    by_gpu = {f["component"]: f for f in _check(babysitter_env(gpus, fakenvml_lib, tmp_path))}
    assert by_gpu["gpu0"]["code"] == "recovery.gpu_reset"
    assert by_gpu["gpu0"]["details"]["source"] == "reset_status"
    assert by_gpu["gpu1"]["code"] == "recovery.drain_and_reset"
    assert by_gpu["gpu1"]["action"] == "reset_gpu"
    assert by_gpu["gpu2"]["severity"] == "ok"
    assert (by_gpu["gpu3"]["severity"], by_gpu["gpu3"]["code"]) == ("info", "recovery.unsupported")
    for gpu in ("gpu4", "gpu5"):
        f = by_gpu[gpu]
        assert (f["severity"], f["code"], f["action"]) == ("warning", "recovery.unknown", "inspect")
    assert "999" in by_gpu["gpu4"]["message"] and "42" in by_gpu["gpu5"]["message"]


@pytest.mark.parametrize("a", list(EXPECTED), ids=lambda a: a.name.lower())
def test_each_action_maps_to_its_rung(a: RecoveryAction):
    """The ladder's rung of each action's finding: reset, reboot, the IMEX restart; drain P2P
    has none (the node stays drained, its reason names it)."""
    action, rung = EXPECTED[a]
    assert a.action is action and a.severity is Severity.CRITICAL
    f = xid_finding("xid.kmsg", 154, {}, "gpu2", "GPU 2", "", a)
    assert drain_worthy(f)
    table = LadderTable.from_config(parse_config({}).remediation)
    if rung is None:  # drain P2P: drained for a human, the reason says so
        assert not remediable(f) and "P2P" in f.message
    elif rung is Rung.RESTART_FABRIC:  # recover IMEX domain: the agent restarts nvidia-imex
        # (XID 154's own finding waits for a human; gpu.recovery's, read at the same time,
        # climbs the ladder)
        check_f = Finding(
            check="gpu.recovery",
            component="gpu2",
            severity=a.severity,
            code=a.code,
            message=f"GPU 2: driver recovery action: {a.reason}",
            action=a.action,
        )
        assert remediable(check_f) and "IMEX" in check_f.message
        assert table.rungs(a.code, a.action) == (Rung.RESTART_FABRIC, Rung.REBOOT, Rung.INSPECT)
        assert units_for(a.code) == ["nvidia-imex"]
    else:
        assert remediable(f)
        assert table.first(fault_class(f), f.action) is rung
        assert table.first(a.code, a.action) is rung  # the check's own code, by default
    assert RecoveryAction.NONE.action is Action.NONE
    assert RecoveryAction.NONE.severity is Severity.OK


def test_reset_status_fields_stand_for_actions():
    assert from_reset_status(0, 0) is RecoveryAction.NONE
    assert from_reset_status(1, 0) is RecoveryAction.GPU_RESET
    assert from_reset_status(1, 1) is RecoveryAction.DRAIN_AND_RESET


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # as drivers print it (r550+; public kernel logs)
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", 2),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", 1),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", 1),
        ("GPU recovery action changed to 0x3", 3),
        ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", 0),
        ("GPU recovery action changed to 0x9 (Something New)", None),  # unknown, no guess
        ("Channel exception", None),
    ],
)
def test_xid154_text(text: str, want: int | None):
    got = parse_xid154(text)
    assert (None if got is None else int(got)) == want


def test_xid154_from_the_kernel_log_carries_its_action():
    line = (
        "NVRM: Xid (PCI:0000:5d:00): 154, GPU recovery action changed from 0x0 (None) "
        "to 0x2 (Node Reboot Required)"
    )
    pci, xid, rest = parse_kmsg_line(line) or ("", 0, "")
    f = xid_finding("xid.kmsg", xid, {}, "gpu3", f"PCI {pci}", rest)
    assert (f.severity, f.action, f.code) == (Severity.CRITICAL, Action.REBOOT, "xid.154")
    assert f.details["recovery_action"] == 2 and "node reboot" in f.message
    # back to none: nothing to do
    back = xid_finding("xid.kmsg", 154, {}, "gpu3", "GPU 3", "recovery action changed to 0x0")
    assert back.severity is Severity.OK
    # no text and no field read: unknown, drained until gpu.recovery reads it (never ok)
    bare = xid_finding("xid.nvml", 154, {}, "gpu3", "GPU 3")
    assert (bare.severity, bare.action) == (Severity.CRITICAL, Action.DRAIN)


def test_nvlink_xids_follow_nvidias_catalog_and_sites_override():
    """74 (WORKFLOW_NVLINK_ERR) and 144-150 (WORKFLOW_NVLINK5_ERR): reset the GPU; a NVLink5
    line that says Nonfatal needs no reset; a site override wins."""
    for xid in (74, 144, 145, 150):
        assert classify(xid).action is Action.RESET_GPU, xid
    assert classify(145, text="RLW_REMAP Nonfatal XC0 i0 Link 00").action is Action.INSPECT
    assert classify(74, {74: "inspect"}).action is Action.INSPECT
    cfg = parse_config({"checks": {"xid": {"actions": {74: "inspect", 154: "ignore"}}}})
    assert cfg.checks.xid.overrides == {74: "inspect", 154: "ignore"}
    assert classify(154, cfg.checks.xid.overrides).severity is Severity.OK


def test_nvml_events_xid154_reads_the_field_and_recovery_events_are_typed(
    gpus, fakenvml_lib, tmp_path
):
    """XID 154 as an NVML event has no text: the agent reads GPU 2's recovery action at once
    (node reboot -> reboot). The recovery-action event (0x8000) carries the action: drain P2P
    -> a drain naming it; a value no table knows -> inspect."""
    from tests.test_xid_events import EVENT_SCRIPT

    for gpu in (5, 6):
        gpus.supported_events(gpu, 0xC1F | EVENT_RECOVERY_ACTION)
    gpus.recovery(2, int(RecoveryAction.NODE_REBOOT))
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    p = subprocess.Popen(
        [sys.executable, "-c", EVENT_SCRIPT, "30"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        gpus.xid(2, 154)
        gpus.event(5, EVENT_RECOVERY_ACTION, int(RecoveryAction.DRAIN_P2P))
        gpus.event(6, EVENT_RECOVERY_ACTION, 99)
        got = [json.loads(p.stdout.readline()) for _ in range(3)]
    finally:
        p.kill()
        p.wait(timeout=10)
    by_gpu = {f["component"]: f for f in got}
    xid = by_gpu["gpu2"]
    assert (xid["code"], xid["action"], xid["severity"]) == ("xid.154", "reboot", "critical")
    assert xid["details"]["recovery_action"] == 2
    p2p = by_gpu["gpu5"]
    assert (p2p["code"], p2p["action"]) == ("recovery.drain_p2p", "drain")
    assert "P2P" in p2p["message"] and p2p["details"]["recovery_action"] == 3
    assert (by_gpu["gpu6"]["code"], by_gpu["gpu6"]["action"]) == ("gpu.recovery_action", "inspect")


def test_a_gpu_reset_ends_that_gpus_kernel_log_xids(tmp_path):
    """The kernel log's XIDs stay open until the node reboots, or until the GPU they name is
    reset (a reset-class XID 74 stayed open after a good reset: the node was drained, reset
    and resumed again and again). Another GPU's, and a later one's, stay."""
    import time

    from babysitter.checks.base import CheckContext
    from babysitter.checks.nvml import Device
    from babysitter.checks.xid.check import KmsgXidCheck

    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "NVRM: Xid (PCI:0000:5d:00): 74, pid=1, NVLink: fatal error detected on link 2\n"
        "NVRM: Xid (PCI:0000:9a:00): 48, pid=1, DBE\n"
    )
    devs = {
        "5d:00": Device(3, None, "H100", "GPU-3", "00000000:5D:00.0"),
        "9a:00": Device(4, None, "H100", "GPU-4", "00000000:9A:00.0"),
    }

    class Check(KmsgXidCheck):
        def _pci_to_gpu(self):
            return devs

    check = Check(CheckContext(parse_config({"agent": {"kmsg_path": str(kmsg)}}), "n"))
    assert {(f.component, f.code) for f in check.run()} == {("gpu3", "xid.74"), ("gpu4", "xid.48")}
    check.gpu_was_reset(3, time.time())
    assert {(f.component, f.code) for f in check.run()} == {("gpu4", "xid.48")}
    with kmsg.open("a") as f:  # the same XID after the reset is a new fault
        f.write("NVRM: Xid (PCI:0000:5d:00): 74, pid=1, NVLink: fatal error detected\n")
    assert ("gpu3", "xid.74") in {(f.component, f.code) for f in check.run()}


def test_a_reset_ends_a_kernel_log_xid_the_fast_tier_had_not_read_yet(tmp_path):
    """The driver logs XID 74 and NVML reports it; the controller orders a reset before the
    fast tier has read the kernel log. The line, read after the reset began, was stamped after
    it: the reset did not end it, the rung failed and the node was rebooted for nothing (a
    recovery e2e run met this). The agent reads the log up to the reset's start first, and
    what it read then is said once by the next run; a line the kernel logs after the reset
    is a new fault."""
    import time

    from babysitter.checks.base import CheckContext
    from babysitter.checks.nvml import Device
    from babysitter.checks.xid.check import KmsgXidCheck

    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    devs = {"5d:00": Device(3, None, "H100", "GPU-3", "00000000:5D:00.0")}

    class Check(KmsgXidCheck):
        def _pci_to_gpu(self):
            return devs

    check = Check(CheckContext(parse_config({"agent": {"kmsg_path": str(kmsg)}}), "n"))
    assert [f.code for f in check.run()] == ["xid.none"]
    with kmsg.open("a") as f:
        f.write("NVRM: Xid (PCI:0000:5d:00): 74, pid=1, NVLink: fatal error detected on link 2\n")
        f.write("NVRM: Xid (PCI:0000:5d:00): 999, pid=1, an XID no table knows\n")
    check.before_gpu_reset()
    started = time.time()  # reset.carry_out: the reset begins after the catch-up
    check.gpu_was_reset(3, started)
    codes = {f.code for f in check.run()}
    assert "xid.74" not in codes  # ended by the reset
    assert "xid.999" in codes  # read by the catch-up, said by the run after it, once
    assert "xid.999" not in {f.code for f in check.run()}
    with kmsg.open("a") as f:
        f.write("NVRM: Xid (PCI:0000:5d:00): 74, pid=1, NVLink: fatal error detected on link 2\n")
    assert "xid.74" in {f.code for f in check.run()}
