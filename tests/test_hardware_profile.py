"""One hardware profile drives the GPU, IB and NCCL expectations: detected from the GPU model NVML
reports, or configured; single values overridden per check."""

from __future__ import annotations

import json
from typing import get_args

import pytest

from babysitter.checks.profile import expectations
from babysitter.checks.sdc.settings import SdcDtype
from babysitter.config import Config, parse_config
from babysitter.devcluster import simib
from babysitter.hardware.profiles import PROFILES, detect
from tests.fixtures.gpu import babysitter_env, run_babysitter


@pytest.mark.parametrize(
    ("nvml_name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "generic"),
        ("NVIDIA H100 NVL", "generic"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA GH200 480GB", "generic"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm"),
        ("NVIDIA A100 80GB PCIe", "generic"),
        ("Tesla V100-SXM2-32GB", "generic"),
        (None, "generic"),
    ],
)
def test_profile_detected_from_the_nvml_name(nvml_name, profile):
    assert detect(nvml_name).name == profile


def cfg(**sections: dict) -> Config:
    return parse_config(sections)


def test_detected_profile_sets_model_facts_but_requires_no_parts():
    e = expectations(cfg(), "NVIDIA H100 80GB HBM3")
    assert (e.profile, e.source) == ("h100-sxm", "detected")
    assert e.nvlinks == 18 and e.nccl_busbw_gbps == 460.0
    assert (e.ib_ports, e.ib_rate_gbps) == (8, 400.0)
    assert e.gpu_count is None and not e.ib_required


def test_configured_profile_wins_over_the_model_and_requires_its_parts():
    e = expectations(cfg(agent={"hardware_profile": "a100-sxm"}), "NVIDIA H100 80GB HBM3")
    assert (e.profile, e.source) == ("a100-sxm", "configured")
    assert e.nvlinks == 12 and e.nccl_busbw_gbps == 228.0
    assert e.gpu_count == 8 and e.ib_required


def test_per_check_values_override_the_profile():
    c = cfg(
        agent={"hardware_profile": "h100-sxm"},
        checks={
            "gpu": {"expected_count": 4, "thresholds": {"temp_warn_margin_c": 9}},
            "infiniband": {"expected_ports": 2, "expected_rate_gbps": 200},
            "nccl": {"min_busbw_gbps": 300},
        },
    )
    e = expectations(c, None)
    assert e.gpu_count == 4 and c.checks.gpu.thresholds.temp_warn_margin_c == 9
    assert e.nvlinks == 18  # the rest of the profile stays
    assert (e.ib_ports, e.ib_rate_gbps, e.nccl_busbw_gbps) == (2, 200.0, 300.0)


def test_generic_expects_nothing_of_ib():
    e = expectations(cfg(), None)
    assert (e.profile, e.ib_ports, e.ib_rate_gbps, e.gpu_count) == ("generic", 0, None, None)


def test_every_profile_is_in_the_docs():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "checks.md").read_text()
    for name in PROFILES:
        assert f"| `{name}` |" in page, name


def test_the_sdc_dtypes_the_config_accepts_are_the_verifiers():
    from babysitter.checks.sdc.runner import NP_DTYPES

    assert set(get_args(SdcDtype)) == set(NP_DTYPES)


def ib_findings(env):
    r = run_babysitter(env, "check", "--json", "--only", "ib")
    assert "Traceback" not in r.stderr, r.stderr
    return [(f["code"], f["severity"]) for f in json.loads(r.stdout) if f["severity"] != "ok"]


def test_h100_node_with_four_ib_ports_is_told_eight_are_expected(gpus, fakenvml_lib, tmp_path):
    """Before the profile, an H100 node expected 0 IB ports unless configured."""
    simib.make_tree(tmp_path / "sys-root", devices=4)
    env = babysitter_env(gpus, fakenvml_lib, tmp_path, agent__sysfs_root=str(tmp_path / "sys-root"))
    assert ib_findings(env) == [("ib.ports_below_expected", "warning")]


def test_missing_fabric_is_a_fault_only_when_the_profile_is_configured(
    gpus, fakenvml_lib, tmp_path
):
    env = babysitter_env(gpus, fakenvml_lib, tmp_path, agent__sysfs_root=str(tmp_path))
    r = run_babysitter(env, "check", "--json", "--only", "ib")
    assert r.returncode == 2 and "matches no check" in r.stderr  # detected: no IB check
    env["BABYSITTER_AGENT__HARDWARE_PROFILE"] = "h100-sxm"
    assert ib_findings(env) == [("ib.missing", "critical")]
