"""NVIDIA's Xid catalog as babysitter reads it (babysitter/hardware/xid_catalog.json, generated
from the snapshot in tests/data/world/xid_catalog/): where it comes from, that every XID has a
class, and what real kernel-log lines (tests/data/world/xid_catalog/samples.jsonl) are
classified as: class, severity, action and the job/follow-on flags, the NVLink5 XIDs decoded
by their error status as NVIDIA's "XID 144-150 Decode" sheet says."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from babysitter.checks.xid.check import parse_kmsg_line
from babysitter.finding import Action, Severity
from babysitter.hardware import xid_catalog_gen, xids

FOLDER = Path(__file__).parent / "data" / "world" / "xid_catalog"
DATA = files("babysitter.hardware").joinpath("xid_catalog.json")
SAMPLES = [json.loads(line) for line in (FOLDER / "samples.jsonl").read_text().splitlines()]


def test_data_file_says_where_the_table_comes_from() -> None:
    source = json.loads(DATA.read_text())["source"]
    assert "docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in source["table"]
    assert source["via"].startswith("github:leptonai/gpud/") and "@" in source["via"]
    assert source["read"] and source["driver_version"] and source["upstream_generated_at"]
    assert (Path(__file__).parents[1] / source["snapshot"]).is_file()


def test_generator_reproduces_the_data_file_from_the_snapshot() -> None:
    snapshot = (FOLDER / "gpud_catalog_generated.go").read_text()
    assert xid_catalog_gen.render(snapshot) == DATA.read_text()


def test_every_catalogued_xid_and_decode_row_maps_to_a_class() -> None:
    assert len(xids.ENTRIES) >= 170 and len(xids.NVLINK5_DECODE) >= 90
    for e in xids.ENTRIES.values():
        assert xids.BUCKET_CLASS[e.immediate_action] in xids.CLASSES, e
        assert xids.classify(e.xid).klass in xids.CLASSES
    for r in xids.NVLINK5_DECODE:
        assert xids.DECODE_CLASS[r.immediate_action] in xids.CLASSES, r
    assert frozenset(xids.ENTRIES) == xids.KNOWN_XIDS
    assert frozenset(range(144, 151)) == xids.NVLINK5_XIDS


@pytest.mark.parametrize("sample", SAMPLES, ids=[s["id"] for s in SAMPLES])
def test_real_lines_get_the_catalogs_verdict(sample: dict[str, Any]) -> None:
    parsed = parse_kmsg_line(sample["text"])
    assert parsed is not None and parsed[1] is not None
    _pci, xid, rest = parsed
    want = sample["expect"]
    v = xids.classify(xid, None, rest)
    got = {
        "xid": xid,
        "class": v.klass,
        "severity": v.severity.value,
        "action": v.action.value,
        "follows_other": v.follows_other,
        "job_attributable": v.job_attributable,
    }
    assert got == {k: want[k] for k in got}, v.rule
    if sample["category"] == "nvlink5" and "fallback" not in want["bucket"]:
        # the decode row NVIDIA's sheet gives (unit, error status, bucket) is the one that fired
        unit, status, bucket = want["bucket"].rsplit(" ", 2)
        assert f"status {status} -> {bucket}" in v.rule and unit.split("/")[0] in v.rule


@pytest.mark.parametrize(
    ("xid", "klass", "follows", "job"),
    [
        (13, "app", False, True),  # RESTART_APP
        (31, "app", False, True),  # RESTART_APP
        (43, "ignore", False, True),  # IGNORE, the application's own fault
        (45, "inspect", True, True),  # WORKFLOW_XID_45: "Not Solo: IGNORE (follow other Xid)"
        (48, "reset_gpu", False, False),  # WORKFLOW_XID_48
        (79, "reboot", False, False),  # RESTART_BM
        (94, "app", False, True),  # RESTART_APP: contained, ends with the job
        (95, "reset_gpu", False, False),  # RESET_GPU
        (63, "ignore", False, False),  # IGNORE
        (74, "reset_gpu", False, False),  # WORKFLOW_NVLINK_ERR
        (151, "reboot", False, False),  # RESTART_VM
        (154, "recovery", False, False),  # XID_154
    ],
)
def test_buckets_give_class_and_flags(xid: int, klass: str, follows: bool, job: bool) -> None:
    v = xids.classify(xid)
    assert (v.klass, v.follows_other, v.job_attributable) == (klass, follows, job)


def test_nvlink5_status_decides_ignore_or_reset() -> None:
    fatal_ignored = "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000)"
    v = xids.classify(149, None, fatal_ignored)
    assert (v.klass, v.severity, v.action) == ("ignore", Severity.OK, Action.NONE)
    reset = "RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x00000000 0x00000000)"
    v = xids.classify(145, None, reset)
    assert (v.klass, v.severity, v.action) == ("reset_gpu", Severity.CRITICAL, Action.RESET_GPU)


@pytest.mark.parametrize(
    ("text", "klass"),
    [
        ("", "reset_gpu"),  # no text (an NVML event): fatal until shown otherwise
        ("SAW_EGR Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000)", "inspect"),
        ("SAW_EGR Fatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000)", "reset_gpu"),
        ("SAW_MVB Nonfatal XC0 i0 Link 00", "inspect"),  # status cut off
    ],
)
def test_nvlink5_status_not_in_the_table_keeps_the_old_rule(text: str, klass: str) -> None:
    v = xids.classify(144, None, text)
    assert v.klass == klass and ("not read" in v.rule or "not in the decode table" in v.rule)


def test_site_overrides_win_over_the_table() -> None:
    ignored = "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000)"
    v = xids.classify(149, {149: "reboot"}, ignored)
    assert (v.klass, v.action) == ("reboot", Action.REBOOT) and v.rule.startswith("site override")
    v = xids.classify(13, {13: "reset_gpu"})
    assert (v.klass, v.job_attributable) == ("reset_gpu", True)
    assert xids.classify(79, {13: "ignore"}).klass == "reboot"


def test_unknown_xid_is_inspected_not_drained() -> None:
    v = xids.classify(999)
    assert (v.klass, v.severity, v.action) == ("unknown", Severity.WARNING, Action.INSPECT)
