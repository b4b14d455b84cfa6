"""The kernel-log parser against real NVIDIA driver lines (tests/data/world/kmsg/), and what the
kmsg check makes of them: follow-on XIDs attributed to the XID they follow, the blamed process
and its Slurm job, and lines in no known format counted instead of dropped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from babysitter.checks import unparsed
from babysitter.checks.base import CheckContext
from babysitter.checks.nvml import Device
from babysitter.checks.xid import finding as xid_finding_mod
from babysitter.checks.xid.check import KmsgXidCheck
from babysitter.checks.xid.kmsg import KmsgReader, devkmsg_message, slurm_job_of
from babysitter.config import parse_config
from babysitter.hardware import xids

KMSG = Path(__file__).parent / "data" / "world" / "kmsg" / "samples.jsonl"
SAMPLES = [json.loads(line) for line in KMSG.read_text().splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def _fresh_unparsed():
    unparsed.REGISTRY.clear()
    yield
    unparsed.REGISTRY.clear()


def _read(text: str) -> tuple[list[Any], int]:
    """What a fresh reader makes of a sample's lines, and how many it counted as unparsed."""
    reader = KmsgReader()
    found = [p for line in text.splitlines() for p in reader.feed(line)]
    return found, unparsed.REGISTRY.counts().get("kmsg", 0)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s["id"] for s in SAMPLES])
def test_every_real_kernel_log_line_reads_as_documented(sample: dict[str, Any]) -> None:
    found, n_unparsed = _read(sample["text"])
    expect = sample["expect"]
    if expect.get("unparsed"):
        assert (found, n_unparsed) == ([], 1)
        return
    assert n_unparsed == 0, unparsed.REGISTRY.snapshot()
    if expect.get("ignored"):
        assert found == []
        return
    [got] = found
    assert {
        "xid": got.xid,
        "pci": got.pci,
        "off_bus": got.off_bus,
        "pid": got.pid,
        "name": got.name,
    } == expect


def test_the_corpus_covers_every_bus_loss_wording_and_many_xids() -> None:
    cats = {s["category"] for s in SAMPLES}
    assert {"off_bus", "off_bus_probe", "xid", "xid_follow_on", "unparsed", "sxid"} <= cats
    xid_numbers = {s["expect"].get("xid") for s in SAMPLES} - {None}
    assert len(xid_numbers) >= 15


# ---- the check


def _check(tmp_path: Path, text: str, proc_root: Path | None = None) -> KmsgXidCheck:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(text)
    devs = {"dc:00": Device(2, None, "H100", "GPU-2", "00000000:DC:00.0")}

    class Check(KmsgXidCheck):
        def _pci_to_gpu(self):
            return devs

    check = Check(CheckContext(parse_config({"agent": {"kmsg_path": str(kmsg)}}), "n"))
    if proc_root is not None:
        check.proc_root = proc_root
    return check


@pytest.fixture
def catalog_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog's two marks as hardware/xids.py is to give them (45 follows another XID;
    13, 31, 43, 45 are the application's), whatever the catalog in this tree says yet."""
    real = xids.classify

    def classify(xid: int, overrides: Any = None, text: str = "") -> xids.XidVerdict:
        v = real(xid, overrides, text)
        return msgspec.structs.replace(
            v, follows_other=xid == 45, job_attributable=xid in (13, 31, 43, 45)
        )

    monkeypatch.setattr(xid_finding_mod, "classify", classify)
    monkeypatch.setattr("babysitter.checks.xid.check.classify", classify)


XID79 = "[  100.000000] NVRM: Xid (PCI:0000:dc:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"  # noqa: E501
XID45 = "[  {t:.6f}] NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001\n"


def test_thousands_of_follow_on_xid_45_lines_are_one_fault_not_thousands(tmp_path: Path) -> None:
    # the catalog as shipped (no stand-in): 45 follows another XID
    check = _check(tmp_path, XID79 + "".join(XID45.format(t=100.5 + i / 1000) for i in range(3000)))
    found = check.run()
    assert [(f.component, f.code, f.severity) for f in found] == [("gpu2", "xid.79", "critical")]


def test_a_follow_on_xid_is_attributed_to_the_xid_it_follows(
    tmp_path: Path, catalog_marks: None
) -> None:
    check = _check(tmp_path, "")
    pci = {"dc:00": Device(2, None, "H100", "GPU-2", "00000000:DC:00.0")}
    reader = KmsgReader()
    overrides: dict[int, Any] = {}

    def one(text: str):
        [line] = reader.feed(text)
        return check._line_finding(pci, overrides, line)

    one(XID79)
    near = one(XID45.format(t=104.0))
    assert near.details["follows_xid"] == 79 and near.severity.rank <= 1
    far = one(XID45.format(t=200.0))  # long after: a fault of its own
    assert "follows_xid" not in far.details and far.severity == "warning"
    # the driver's own "caused by previous Xid N" holds whatever the distance
    named = one(
        "NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=python3, Ch 00000001"
        " caused by previous Xid 149"
    )
    assert named.details["follows_xid"] == 149 and named.severity.rank <= 1


def test_a_job_attributable_xid_names_the_process_and_its_slurm_job(
    tmp_path: Path, catalog_marks: None
) -> None:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text(
        "0::/system.slice/slurmstepd.scope/job_123456/step_0/user/task_0\n"
    )
    check = _check(tmp_path, "", proc)
    reader = KmsgReader()
    [line] = reader.feed(
        "NVRM: Xid (PCI:0000:dc:00): 13, pid=4242, name=python, Graphics SM Warp Exception"
    )
    f = check._line_finding({}, {}, line)
    assert (f.details["pid"], f.details["process"], f.details["job_id"]) == (
        4242,
        "python",
        "123456",
    )
    [gone] = reader.feed("NVRM: Xid (PCI:0000:dc:00): 31, pid=999, name=x, MMU Fault")
    assert "job_id" not in check._line_finding({}, {}, gone).details  # the process has ended
    [hw] = reader.feed("NVRM: Xid (PCI:0000:dc:00): 79, pid=4242, name=python, GPU has fallen")
    assert "job_id" not in check._line_finding({}, {}, hw).details  # the node's, not the job's


def test_slurm_job_from_a_cgroup_v1_path(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(
        "12:memory:/slurm/uid_1000/job_77/step_batch/task_0\n11:cpuset:/slurm/uid_1000/job_77\n"
    )
    assert slurm_job_of(7, tmp_path) == "77"
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
    assert slurm_job_of(8, tmp_path) is None


def test_a_bus_loss_printed_only_by_the_device_print_drains_the_node(tmp_path: Path) -> None:
    check = _check(tmp_path, "[ 5.0] NVRM: GPU 0000:dc:00.0: GPU has fallen off the bus.\n")
    [f] = check.run()
    assert (f.component, f.code, f.severity, f.action) == (
        "gpu2",
        "gpu.fallen_off_bus",
        "critical",
        "reboot",
    )


def test_the_probe_time_bus_loss_across_three_lines_of_a_log_file(tmp_path: Path) -> None:
    [s] = [s for s in SAMPLES if s["id"] == "kmsg-nvsentinel155-probe"]
    check = _check(tmp_path, "[ 1.0] pci noise\n" + s["text"].replace("b3:00", "dc:00") + "\n")
    [f] = check.run()
    assert (f.component, f.code) == ("gpu2", "gpu.fallen_off_bus")


def test_a_devkmsg_record_keeps_its_stamp_and_its_lines() -> None:
    rec = (
        b"3,1234,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5)"
        b" installed in this system has\\x0aNVRM: fallen off the bus and is not responding to"
        b" commands.\n SUBSYSTEM=pci\n"
    )
    [got] = KmsgReader().feed(devkmsg_message(rec))
    assert (got.pci, got.off_bus, got.stamp) == ("0000:b3:00.0", True, 1843.308145)


def test_an_unknown_wording_is_counted_and_sampled_not_dropped(tmp_path: Path) -> None:
    check = _check(
        tmp_path,
        "NVRM: Xid error: xyz, invalid data\n"
        "NVRM: Xid (PCI:0000:dc:00): 1234567, an XID number no driver prints\n"
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up\n",
    )
    found = check.run()
    assert [f.code for f in found] == ["xid.none"]
    seen = check.metrics["unparsed_lines"]["kmsg"]  # type: ignore[index]
    assert seen["total"] == 2  # the switch's SXid is a known format, not an unknown one
    assert seen["samples"][0]["line"] == "NVRM: Xid error: xyz, invalid data"


def test_the_agent_exports_the_unparsed_counter() -> None:
    from prometheus_client import generate_latest

    from babysitter.agent.metrics import AgentMetrics

    m = AgentMetrics("127.0.0.1:0")
    unparsed.note("kmsg", "NVRM: Xid error: xyz")
    unparsed.note("kmsg", "NVRM: Xid error: abc")
    m.update_unparsed(unparsed.REGISTRY.counts())
    m.update_unparsed(unparsed.REGISTRY.counts())  # the same totals again: no double count
    text = generate_latest(m.registry).decode()
    assert 'babysitter_unparsed_lines_total{source="kmsg"} 2.0' in text


def test_a_job_attributable_xid_ends_with_its_job_not_at_the_next_reboot(tmp_path: Path) -> None:
    """XID 45 alone (the catalog's job-attributable 'preemptive cleanup') is a warning while its
    job runs; once the job is gone from this node it is no longer open. Before, it stayed open
    until a reboot (a week-old fleet showed a warning on every node)."""
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_77/step_0\n")
    check = _check(tmp_path, XID45.format(t=5.0).replace("1818990", "4242"), proc)
    running: frozenset[str] | None = frozenset({"77"})
    check.local_jobs = lambda: running
    [open_45] = check.run()
    assert (open_45.code, open_45.severity, open_45.details["job_id"]) == (
        "xid.45",
        "warning",
        "77",
    )
    running = None  # slurmd could not be asked: nothing ends on an unknown
    assert [f.code for f in check.run()] == ["xid.45"]
    running = frozenset({"78"})  # job 77 ended; another job runs
    assert [f.code for f in check.run()] == ["xid.none"]


def test_a_job_attributable_xid_without_a_job_ends_when_the_node_runs_none(
    tmp_path: Path,
) -> None:
    check = _check(tmp_path, XID45.format(t=5.0), tmp_path / "no-proc")
    running = frozenset({"5"})
    check.local_jobs = lambda: running
    assert [f.code for f in check.run()] == ["xid.45"]  # some job still runs: it may be its
    running = frozenset()
    assert [f.code for f in check.run()] == ["xid.none"]


def test_only_an_xid_with_a_stated_reason_stays_open(tmp_path: Path) -> None:
    """XID 79 stays open, saying why ("the GPU is off the bus until a reboot"); an XID the
    catalog sends to a human (inspect) is in the run that read it, then no longer open: the
    table (hardware/sticky.py) gives it no reason to outlive its line."""
    inspect = min(
        x
        for x, e in xids.ENTRIES.items()
        if xids.classify(x).klass == "inspect"
        and not xids.job_attributable(x)
        and not xids.follows_other(x)
        and x not in xids.NVLINK5_XIDS
    )
    line = f"[  101.000000] NVRM: Xid (PCI:0000:dc:00): {inspect}, pid=1, name=x, something\n"
    check = _check(tmp_path, XID79 + line)
    first = {f.code: f for f in check.run()}
    assert set(first) == {"xid.79", f"xid.{inspect}"}
    assert first["xid.79"].details["sticky_reason"] == "the GPU is off the bus until a reboot"
    assert "sticky_reason" not in first[f"xid.{inspect}"].details
    assert [f.code for f in check.run()] == ["xid.79"]
