"""`babysitter check` on simulated GPUs: the real pynvml binding over the fake libnvidia-ml."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from babysitter.devcluster import fakenvml
from babysitter.devcluster.fakenvml import read_calls
from tests.fixtures.gpu import babysitter_env, run_babysitter


def check_json(env, *extra):
    r = run_babysitter(env, "check", "--json", *extra)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def non_ok(findings):
    return [f for f in findings if f["severity"] != "ok"]


@pytest.fixture
def env(gpus, fakenvml_lib, tmp_path):
    return babysitter_env(gpus, fakenvml_lib, tmp_path)


def test_eight_healthy_gpus_exit_0_and_each_gpu_reported(env):
    rc, findings = check_json(env)
    assert rc == 0, non_ok(findings)
    present = {f["component"] for f in findings if f["code"] == "gpu.present"}
    assert present == {f"gpu{i}" for i in range(8)}
    assert non_ok(findings) == []


def test_volatile_dbe_on_gpu3_is_critical_and_names_the_gpu(env, gpus):
    gpus.set(3, dbe_volatile=1, uuid="GPU-3333", pci="00000000:5D:00.0")
    rc, findings = check_json(env)
    assert rc == 2
    [f] = non_ok(findings)
    assert f["component"] == "gpu3" and f["severity"] == "critical"
    assert f["code"] == "ecc.dbe.volatile"
    assert "GPU 3" in f["message"] and "GPU-3333" in f["message"]
    assert "00000000:5D:00.0" in f["message"]
    assert f["details"]["uuid"] == "GPU-3333" and f["details"]["index"] == 3


def test_lost_gpu5_is_critical_reboot(env, gpus):
    gpus.lose(5)
    rc, findings = check_json(env)
    assert rc == 2
    lost = [f for f in findings if f["code"] == "gpu.lost"]
    assert [f["component"] for f in lost] == ["gpu5"]
    assert lost[0]["action"] == "reboot" and "GPU 5" in lost[0]["message"]


def test_row_remap_failure(env, gpus):
    gpus.set(6, remap_failure=1)
    rc, findings = check_json(env)
    assert rc == 2
    assert [(f["component"], f["code"]) for f in non_ok(findings)] == [("gpu6", "row_remap.failed")]


def test_memory_thermal_and_clock_signals_each_name_their_gpu(env, gpus):
    gpus.set(0, retired_pending=1)
    gpus.set(1, retired_dbe=62)
    gpus.set(2, sbe_volatile=20_000)
    gpus.set(3, dbe_aggregate=2)
    gpus.set(4, temp=88, temp_slowdown=90, temp_shutdown=95)
    gpus.set(5, temp=96, temp_slowdown=90, temp_shutdown=95)
    gpus.set(6, clocks_event_reasons=0x40)
    gpus.set(7, remap_pending=1, remap_unc=513)
    rc, findings = check_json(env)
    assert rc == 2
    assert sorted((f["component"], f["code"], f["severity"]) for f in non_ok(findings)) == [
        ("gpu0", "retired_pages.pending", "critical"),
        ("gpu1", "retired_pages.limit", "critical"),
        ("gpu2", "ecc.sbe.volatile", "warning"),
        ("gpu3", "ecc.dbe.aggregate", "warning"),
        ("gpu4", "thermal.slowdown", "warning"),
        ("gpu5", "thermal.shutdown", "critical"),
        ("gpu6", "clocks.hw_slowdown", "warning"),
        ("gpu7", "row_remap.limit", "critical"),
        ("gpu7", "row_remap.pending", "critical"),
    ]
    assert all(f["details"]["index"] == int(f["component"][3:]) for f in non_ok(findings))


def test_pcie_x8_of_x16_is_at_least_warning(env, gpus):
    gpus.set(2, pcie_width=8)
    rc, findings = check_json(env)
    assert rc >= 1
    [f] = non_ok(findings)
    assert f["component"] == "gpu2" and f["code"] == "pcie.width_degraded"
    assert f["severity"] in ("warning", "critical")


def test_inactive_nvlink_is_reported_on_the_link(env, gpus):
    gpus.set(1, nvlink_down="4")
    rc, findings = check_json(env)
    assert rc == 2
    [f] = non_ok(findings)
    assert f["component"] == "nvlink:gpu1/4" and f["code"] == "nvlink.inactive"


def test_nvlink_state_is_one_field_read_per_gpu_not_a_call_per_link(env, gpus, tmp_path):
    calls = tmp_path / "calls"
    env["FAKE_NVML_CALLS"] = str(calls)
    gpus.set(2, nvlink_down="0,17")
    rc, findings = check_json(env, "--only", "gpu.nvlink")
    assert rc == 2
    assert sorted(f["component"] for f in non_ok(findings)) == ["nvlink:gpu2/0", "nvlink:gpu2/17"]
    counts = read_calls(calls)
    assert counts.get("nvmlDeviceGetNvLinkState", 0) == 0
    # link count once + the states once, per GPU
    assert counts["nvmlDeviceGetFieldValues"] == 2 * 8


def test_a_driver_without_the_nvlink_state_field_still_reports_the_link(env, gpus, tmp_path):
    calls = tmp_path / "calls"
    env["FAKE_NVML_CALLS"] = str(calls)
    for gpu in range(8):
        gpus.set(gpu, nvlink_fields=0)
    gpus.set(5, nvlink_down="3")
    rc, findings = check_json(env, "--only", "gpu.nvlink")
    assert rc == 2
    [f] = non_ok(findings)
    assert (f["component"], f["code"], f["severity"]) == (
        "nvlink:gpu5/3",
        "nvlink.inactive",
        "critical",
    )
    assert read_calls(calls)["nvmlDeviceGetNvLinkState"] >= 18 * 8  # the per-link scan


def test_not_supported_on_one_board_is_not_a_fault(env, gpus):
    gpus.error(4, "nvmlDeviceGetRemappedRows", fakenvml.NOT_SUPPORTED)
    gpus.error(4, "nvmlDeviceGetNvLinkState", fakenvml.NOT_SUPPORTED)
    rc, findings = check_json(env)
    assert rc == 0, non_ok(findings)


@pytest.mark.parametrize(
    "code,finding_code", [(9, "driver.not_loaded"), (18, "driver.version_mismatch")]
)
def test_driver_init_errors(env, gpus, code, finding_code):
    gpus.set(init_error=code)
    rc, findings = check_json(env)
    assert rc == 2
    assert finding_code in {f["code"] for f in findings}


def test_xid79_in_kernel_log_is_critical_reboot_and_xid13_is_not_a_node_fault(env, gpus, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "[  1.0] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics Exception\n"
    )
    rc, findings = check_json(env, "--only", "xid")
    assert rc == 0
    # XID 13 is the application's fault: nothing about the node is reported
    assert [(f["code"], f["severity"]) for f in findings] == [("xid.none", "ok")]

    with kmsg.open("a") as fh:
        fh.write(
            "[  2.0] NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.\n"
        )
    rc, findings = check_json(env, "--only", "xid")
    assert rc == 2
    [f79] = [f for f in findings if f["code"] == "xid.79"]
    assert f79["severity"] == "critical" and f79["action"] == "reboot"
    assert f79["component"] == "gpu3"  # PCI 5d:00 is GPU 3 on the simulated node
    assert f79["details"]["rule"] == "catalog: xid 79 -> reboot"


def test_site_override_of_the_xid_table(env, gpus, tmp_path):
    (tmp_path / "kmsg").write_text("NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics\n")
    env["BABYSITTER_CHECKS__XID__ACTIONS"] = '{"13": "reset_gpu"}'
    rc, findings = check_json(env, "--only", "xid")
    assert rc == 2
    [f] = non_ok(findings)
    assert f["details"]["rule"].startswith("site override")


def test_hung_nvml_call_is_cut_off_and_the_run_ends(env, gpus):
    gpus.delay("nvmlDeviceGetTotalEccErrors", 30)
    env["BABYSITTER_CHECKS__GPU__TIMEOUT_S"] = "2"
    r = run_babysitter(env, "check", "--json", "--only", "gpu.memory", timeout=25)
    findings = json.loads(r.stdout)
    assert r.returncode == 2
    [f] = findings
    assert f["code"] == "check.timeout" and f["check"] == "gpu.memory"


def test_human_output_lists_problems(env, gpus):
    gpus.set(3, dbe_volatile=2)
    r = run_babysitter(env, "check")
    assert r.returncode == 2
    assert "ecc.dbe.volatile" in r.stdout and "gpu3" in r.stdout


def test_every_nvml_symbol_the_checks_use_is_exported(fakenvml_lib):
    import re
    from pathlib import Path

    used: set[str] = set()
    for mod in ("gpu/check.py", "nvml.py", "xid/check.py", "xid/events.py"):
        src = (Path(__file__).resolve().parents[1] / "babysitter" / "checks" / mod).read_text()
        used |= set(re.findall(r"\bnv\.(nvml[A-Za-z_0-9]+)\b", src))
    funcs = {u for u in used if u[4].isupper() and not u.startswith("nvmlEventType")}
    # pynvml wrapper name -> C symbol it resolves
    rename = {
        "nvmlInit": "nvmlInitWithFlags",
        "nvmlDeviceGetCount": "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex": "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetPciInfo": "nvmlDeviceGetPciInfo_v3",
    }
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(fakenvml_lib / "libnvidia-ml.so.1")],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    exported = {line.split()[-1] for line in symbols.splitlines()}
    missing = {rename.get(f, f) for f in funcs} - exported
    assert not missing


def test_the_healthcheck_run_loads_neither_pydantic_nor_click(env, gpus, tmp_path):
    """As a Slurm HealthCheckProgram `check` runs on every node every few minutes: it must stay
    near NHC's cost, and pydantic or click alone would cost more CPU than NHC's whole run
    (pynvml and psutil: more memory; NVML goes through checks/nvml_lite.py, the host through
    /proc). The same run with a config file, --only and a critical finding, so every path is
    taken."""
    gpus.set(3, dbe_volatile=1)
    cfg = tmp_path / "b.toml"
    cfg.write_text("[checks.host]\ncheck_slurmd = false\n")
    probe = (
        "import os, sys, runpy\n"
        "sys.argv = ['babysitter', '--config', sys.argv[1], 'check', '--json', '--only', 'gpu']\n"
        "def leave(code):\n"  # the run ends with os._exit: see what it loaded before that
        "    raise SystemExit(code)\n"
        "os._exit = leave\n"
        "try:\n"
        "    runpy.run_module('babysitter.cli.main', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "heavy = sorted(m for m in ('pydantic', 'click', 'rich', 'fastapi', 'sqlalchemy',"
        " 'pynvml', 'psutil', 'tenacity', 'dataclasses', 'inspect', 'typing_extensions')"
        " if m in sys.modules)\n"
        "print('HEAVY', heavy, 'EXIT', code, file=sys.stderr)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", probe, str(cfg)], capture_output=True, text=True, env=env, timeout=60
    )
    assert "HEAVY [] EXIT 2" in r.stderr, r.stderr
    assert any(f["severity"] == "critical" for f in json.loads(r.stdout))


@pytest.mark.parametrize(
    "function",
    [None, "nvmlDeviceGetTotalEccErrors"],
    ids=["every call on the GPU", "one function on the GPU"],
)
def test_one_hung_gpu_bounds_the_whole_run_and_reports_a_critical_timeout(env, gpus, function):
    """Slurm's HealthCheckProgram with one GPU whose driver calls never return (600 s here):
    the run ends on its own (it took 100 s and more, waiting for hung threads), critical,
    naming the timeout, and the process exits without waiting for the stuck threads. Our
    limit (120 s, far below the hang) only bounds the test; the run's own bound is the check
    timeout, not a measured time."""
    gpus.hang(5, 600, function)
    r = run_babysitter(env, "check", "--json", timeout=120)
    findings = json.loads(r.stdout)
    assert r.returncode == 2, findings
    timeouts = [f for f in findings if f["code"] == "check.timeout"]
    assert timeouts and all(f["severity"] == "critical" for f in timeouts), findings


def test_a_boards_temperature_thresholds_are_read_once_and_anew_after_a_reset(monkeypatch):
    """The shutdown and slowdown thresholds are the board's (VBIOS): read on the first thermal
    read of a GPU, not on every fast-tier read; the temperature itself is read every time."""
    from babysitter.checks import nvml
    from babysitter.checks.base import CheckContext
    from babysitter.checks.gpu.check import GpuThermalCheck
    from babysitter.config import parse_config

    nv = nvml.nv
    limits = {
        nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 95,
        nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 90,
    }
    asked: list[int] = []
    temp = [40]

    def threshold(handle, kind):
        asked.append(kind)
        return limits[kind]

    monkeypatch.setattr(nv, "nvmlDeviceGetTemperature", lambda handle, sensor: temp[0])
    monkeypatch.setattr(nv, "nvmlDeviceGetTemperatureThreshold", threshold)
    chk = GpuThermalCheck(CheckContext(parse_config({}), "n"))
    dev = nvml.Device(3, object(), "fake", "GPU-3333", "00000000:5D:00.0")

    def codes() -> list[str]:
        return [f.code for f in chk._temperature(dev, chk.thresholds())]

    assert codes() == []
    temp[0] = 88
    assert codes() == ["thermal.slowdown"]
    temp[0] = 96
    assert codes() == ["thermal.shutdown"]
    assert len(asked) == 2  # once per threshold for the three reads
    chk.gpu_was_reset(3, 0.0)
    limits[nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN] = 97
    assert codes() == ["thermal.slowdown"]
    assert len(asked) == 4
