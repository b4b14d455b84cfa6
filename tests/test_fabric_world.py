"""The fabric check's judge against real fabric readings (tests/data/world/fabric/). The check
reads NVML structs, not text: each sample's printed words are mapped back to the NVML values
nvidia-smi (or gpud) rendered them from, and the judge the check uses (judge.gpu_fabric) rates
them. IMEX answers go through judge.imex_domain as printed."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from babysitter.checks.fabric import judge
from babysitter.devcluster import fakenvml
from babysitter.finding import Severity
from tests.fixtures.gpu import babysitter_env, run_babysitter

STANDIN = Path(__file__).parent / "fixtures" / "standin_fabric"
FOLDER = Path(__file__).parent / "data" / "world" / "fabric"
SAMPLES = [json.loads(line) for line in (FOLDER / "samples.jsonl").read_text().splitlines()]

# nvidia-smi's words -> NVML values (nvmlGpuFabricState_t, NVML_GPU_FABRIC_HEALTH_*)
_STATE = {"N/A": 0, "Not Supported": 0, "Not Started": 1, "In Progress": 2, "Completed": 3}
_STATUS = {"Success": 0, "N/A": 0, "Insufficient Resources": 23}  # NVML_ERROR_INSUFFICIENT_...
_SUMMARY = {"N/A": 0, "Not Supported": 0, "Healthy": 1, "Unhealthy": 2, "Limited Capacity": 3}
_UNKNOWN_SUMMARY = 0x7F  # a value no NVML defines: a word babysitter cannot place
_TRI = {"N/A": 0, "Not Supported": 0, "True": 1, "Degraded": 1, "False": 2, "Full": 2}
_CONFIG = {"N/A": 0, "None": 1}
# (field, shift) of the 2-bit mask sub-fields, by each form's name for them
_MASK = {
    "bandwidth": 0,
    "route_recovery_in_progress": 2,
    "route recovery in progress": 2,
    "route recovery": 2,
    "route_unhealthy": 4,
    "route unhealthy": 4,
    "access_timeout_recovery": 6,
    "access timeout recovery": 6,
}


def _fields(form: str, text: str) -> dict[str, str]:
    """The sample's printed name -> word pairs, names lower-case."""
    if form == "smi_xml":
        root = ET.fromstring(text)
        return {e.tag.lower(): (e.text or "").strip() for e in root.iter() if len(e) == 0}
    if form == "gpud_json":
        doc = json.loads(json.loads(f'"{text}"'))
        return {k: v for k, v in {**doc, **doc.pop("health")}.items() if isinstance(v, str)}
    if form == "gpud_table":
        rows = (re.match(r"^\|\s*(.+?)\s*\|\s*(.*?)\s*\|$", ln) for ln in text.splitlines())
        return {m.group(1).lower(): m.group(2) for m in rows if m}
    rows = (re.match(r"^\s*(\S.*?)\s*:\s(.*)$", ln) for ln in text.splitlines())
    return {m.group(1).lower(): m.group(2).strip() for m in rows if m}


def _nvml(fields: dict[str, str]) -> tuple[int, int, int, int]:
    """(state, status, health mask, health summary) as NVML gave them to the printer."""
    state = _STATE[fields["state"]]
    status = _STATUS[fields["status"]]
    said = fields.get("summary", fields.get("health summary", "N/A"))
    summary = _SUMMARY.get(said, _UNKNOWN_SUMMARY)
    mask = 0
    for name, shift in _MASK.items():
        if name in fields:
            mask |= _TRI[fields[name]] << shift
    config = fields.get("incorrect_configuration", fields.get("incorrect configuration", "N/A"))
    return state, status, mask | _CONFIG[config] << 8, summary


def _verdicts(s: dict[str, Any]) -> list[judge.Verdict]:
    if s["form"] == "imex":
        return [judge.imex_domain(s["text"])]
    state, status, mask, summary = _nvml(_fields(s["form"], s["text"]))
    # an untrained fabric is judged as seen past the grace (the threads show stuck ones)
    return judge.gpu_fabric(
        state, status, mask, summary, 300.0, 300.0, s["expect"].get("required", False)
    )


def _healthy(verdicts: list[judge.Verdict]) -> bool | None:
    if any(v.code.endswith("_unknown") for v in verdicts):
        return None
    return not any(v.severity in (Severity.WARNING, Severity.CRITICAL) for v in verdicts)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s["id"] for s in SAMPLES])
def test_each_real_fabric_reading_is_rated_as_its_source_says(sample):
    verdicts = _verdicts(sample)
    expect = sample["expect"]
    if sample["form"] != "imex":
        state = _STATE[_fields(sample["form"], sample["text"])["state"]]
        assert judge.STATE_NAMES[state] == expect["state"]
    faults = [v.code for v in verdicts if v.severity is not Severity.OK] or [
        v.code for v in verdicts if sample["form"] == "imex"
    ]
    assert faults == expect["codes"]
    assert _healthy(verdicts) is expect["healthy"]


def test_an_unhealthy_summary_with_status_success_and_a_clean_mask_is_a_drain():
    """The issue's case (dra-driver-nvidia-gpu #626): every bit of the mask clean or
    unsupported, Status Success, and the driver's own summary Unhealthy."""
    [sample] = [s for s in SAMPLES if s["id"] == "smi-text-gb200-summary-unhealthy-status-success"]
    [v] = _verdicts(sample)
    assert (v.severity, v.code, v.action.value) == (Severity.CRITICAL, "fabric.unhealthy", "drain")


def test_the_corpus_has_real_machines_in_every_form():
    machine = {s["form"] for s in SAMPLES if s["captured"] == "machine"}
    assert {"smi_text", "smi_xml", "gpud_table", "gpud_json"} <= machine
    assert len(SAMPLES) >= 15


def test_the_check_reads_the_summary_from_the_driver(gpus, fakenvml_lib, tmp_path):
    """Through the real binding over the fake NVML (v3 struct): GPU 5 of a detected HGX says
    Completed, status Success, every mask bit clean, and summary Unhealthy (2)."""
    clean = fakenvml.health_mask(False, False, False, False)
    for i in range(8):
        gpus.fabric(i, fakenvml.FABRIC_COMPLETED, health=clean)
    gpus.set(5, fabric_summary=judge.SUMMARY_UNHEALTHY)
    gpus.set(6, fabric_summary=judge.SUMMARY_HEALTHY)
    env = babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        checks__fabric__systemctl=str(STANDIN / "systemctl"),
    )
    env["STANDIN_nvidia_fabricmanager"] = "active"
    r = run_babysitter(env, "check", "--json", "--only", "gpu.fabric")
    assert "Traceback" not in r.stderr, r.stderr
    faults = [f for f in json.loads(r.stdout) if f["severity"] not in ("ok", "info")]
    assert [(f["component"], f["code"], f["action"]) for f in faults] == [
        ("gpu5", "fabric.unhealthy", "drain")
    ]
