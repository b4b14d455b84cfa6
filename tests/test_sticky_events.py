"""Event findings last until the node reboots: an agent restart keeps an XID 79, a new boot id
forgets it. The real agent on the fake libnvidia-ml; it ships to a port where nothing listens,
so its spool holds every report it sent, in order."""

from __future__ import annotations

import subprocess
import sys
import uuid

from babysitter.agent.sticky import StickyFindings
from babysitter.checks.xid.finding import xid_finding
from babysitter.finding import Finding, Severity
from tests.fixtures.controller import free_port
from tests.fixtures.gpu import babysitter_env
from tests.fixtures.slurm import wait_for
from tests.test_tiers import spooled


def agent(env):
    return subprocess.Popen(
        [sys.executable, "-m", "babysitter.cli.main", "agent"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(p):
    p.terminate()
    p.wait(timeout=20)


def test_xid79_survives_an_agent_restart_and_not_a_reboot(gpus, fakenvml_lib, tmp_path):
    boot_id = tmp_path / "boot_id"
    boot_id.write_text(str(uuid.uuid4()))
    token = tmp_path / "node.token"
    token.write_text("t")
    token.chmod(0o600)  # the agent refuses a token others can read
    spool = tmp_path / "spool.db"
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        agent__controller_url=f"http://127.0.0.1:{free_port()}",
        agent__node_name="n1",
        agent__token_file=str(token),
        agent__spool_path=str(spool),
        agent__request_timeout_s="0.5",
        agent__boot_id_path=str(boot_id),
        agent__enabled_checks='["gpu.presence"]',
    )

    def full_reports():
        return [r for r in spooled(spool) if r["kind"] == "full"]

    def has_xid79(report):
        return any(f["code"] == "xid.79" and f["component"] == "gpu3" for f in report["findings"])

    p = agent(env)
    try:
        wait_for(lambda: len(full_reports()) >= 1, 60, "first report")
        gpus.xid(3, 79)
        wait_for(lambda: any(has_xid79(r) for r in spooled(spool)), 30, "XID 79 event")
    finally:
        stop(p)
    assert not has_xid79(full_reports()[0])  # before the fault

    # same boot: the restarted agent's first full report still carries the XID
    seen = len(full_reports())
    p = agent(env)
    try:
        wait_for(lambda: len(full_reports()) > seen, 60, "report after restart")
    finally:
        stop(p)
    first = full_reports()[seen]
    assert has_xid79(first)
    assert next(f for f in first["findings"] if f["code"] == "xid.79")["severity"] == "critical"

    # a reboot: new boot id, the GPUs are healthy again, the XID is gone
    boot_id.write_text(str(uuid.uuid4()))
    gpus.reset(8)
    seen = len(full_reports())
    p = agent(env)
    try:
        wait_for(lambda: len(full_reports()) > seen, 60, "report after reboot")
    finally:
        stop(p)
    after = full_reports()[seen]
    assert not has_xid79(after)
    assert all(f["severity"] == "ok" for f in after["findings"])


def _f(code: str, component: str = "gpu2") -> Finding:
    if code.startswith("xid."):  # as the NVML event source makes it (the catalog's class)
        return xid_finding("xid.nvml", int(code[4:]), {}, component, "GPU 2")
    return Finding(
        check="gpu.events", component=component, severity=Severity.CRITICAL, code=code, message="m"
    )


def test_a_dbe_event_is_cleared_when_the_gpu_reads_healthy_after_it(tmp_path):
    path = tmp_path / "ev.json"
    s = StickyFindings(path, "boot-1")
    ev = _f("ecc.dbe.event")
    s.add([ev, _f("xid.79")])
    ok = Finding(
        check="gpu.memory", component="gpu2", severity=Severity.OK, code="memory.ok", message="ok"
    )
    # a run that began before the event proves nothing
    assert s.clear_gone("gpu.memory", [ok], ev.observed_at.timestamp() - 1) == 0
    # one that began after it and saw the GPU healthy (a GPU reset zeroed the counter) does
    assert s.clear_gone("gpu.memory", [ok], ev.observed_at.timestamp() + 1) == 1
    assert [f.code for f in s.values()] == ["xid.79"]  # XIDs wait for the reboot
    assert [f.code for f in StickyFindings(path, "boot-1").values()] == ["xid.79"]
    assert StickyFindings(path, "boot-2").values() == []
    assert StickyFindings(path, "boot-1").values() == []  # forgotten for good


def test_an_application_xid_event_is_not_kept_until_a_reboot(tmp_path):
    """An NVML event of XID 45 (preemptive cleanup: a job's processes torn down) is a warning
    the event report carries once; it is not kept until the next reboot (every node of a
    two-day soak fleet that saw one stayed a warning to the end). The kernel log's copy,
    which names the job, ends with the job (tests/test_kmsg_world.py). A fatal XID stays."""
    from babysitter.checks.base import CheckContext
    from babysitter.checks.xid.events import EVENT_XID, NvmlEvents
    from babysitter.config import load_config

    src = NvmlEvents(CheckContext(load_config(), "n1"))
    cleanup, fatal = (src.finding_for(EVENT_XID, x, None, 2) for x in (45, 79))
    assert cleanup.severity is Severity.WARNING and cleanup.details["job_attributable"] is True
    assert "job_attributable" not in fatal.details
    s = StickyFindings(tmp_path / "ev.json", "boot-1")
    s.add([cleanup, fatal])
    assert [f.code for f in s.values()] == ["xid.79"]
    assert [f.code for f in StickyFindings(tmp_path / "ev.json", "boot-1").values()] == ["xid.79"]


def test_only_findings_with_a_stated_reason_stay_and_say_why(tmp_path):
    """A sticky finding states why (hardware/sticky.py): XID 79 "the GPU is off the bus until a
    reboot", a DBE until a reset clears the counters. A warning the table has no reason for
    (a corrected-error storm, a retired page: polling sees what lasts) is reported once, by
    its event report, and not kept."""
    from babysitter.checks.base import CheckContext
    from babysitter.checks.xid.events import NvmlEvents
    from babysitter.config import load_config

    src = NvmlEvents(CheckContext(load_config(), "n1"))
    storm, retired, dbe = (src.finding_for(t, 0, None, 2) for t in (0x200, 0x400, 0x2))
    s = StickyFindings(tmp_path / "ev.json", "boot-1")
    sent = s.add([storm, retired, dbe, _f("xid.79")])
    assert [f.code for f in sent] == [
        "ecc.sbe.storm",
        "retirement.event",
        "ecc.dbe.event",
        "xid.79",
    ]
    assert [f.details.get("sticky_reason") for f in sent[:2]] == [None, None]
    kept = {f.code: f.details["sticky_reason"] for f in s.values()}
    assert kept == {
        "ecc.dbe.event": sent[2].details["sticky_reason"],
        "xid.79": "the GPU is off the bus until a reboot",
    }
    assert "reset clears the volatile counters" in kept["ecc.dbe.event"]


def test_every_drain_worthy_event_finding_has_a_reason_to_stay():
    """What drains a node stays until its remedy: every critical or drain-worthy finding an
    NVML event or an XID of the catalog can make is in the table."""
    from babysitter.checks.base import CheckContext
    from babysitter.checks.xid.events import EVENT_FINDINGS, EVENT_RECOVERY_ACTION, NvmlEvents
    from babysitter.config import load_config
    from babysitter.controller.loop.decide.node.verdict import drain_worthy
    from babysitter.hardware import sticky
    from babysitter.hardware.recovery import RecoveryAction
    from babysitter.hardware.xids import ENTRIES

    src = NvmlEvents(CheckContext(load_config(), "n1"))
    made = [src.finding_for(t, 0, None, 1) for t in EVENT_FINDINGS if t != EVENT_RECOVERY_ACTION]
    made += [src.finding_for(EVENT_RECOVERY_ACTION, int(a), None, 1) for a in RecoveryAction]
    made += [_f(f"xid.{x}") for x in ENTRIES]
    worthy = [f for f in made if f is not None and drain_worthy(f)]
    assert len(worthy) > 20
    assert [f.code for f in worthy if sticky.reason(f) is None] == []
