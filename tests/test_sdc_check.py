"""The SDC check as a node runs it (`babysitter check --only sdc.matmul`, the same check the
agent runs on the controller's order), on simulated GPUs through the real pynvml: it never
takes GPUs that are in use or whose state it cannot read, and with GPUs but no GPU backend it
refuses to test the CPU in their place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from babysitter.devcluster.fakenvml import FakeGpus
from tests.fixtures.gpu import babysitter_env, run_babysitter

NVML_ERROR_UNKNOWN = 999


def sdc(env: dict[str, str], *extra: str) -> tuple[int, list[dict]]:
    r = run_babysitter(env, "check", "--only", "sdc.matmul", "--json", *extra)
    return r.returncode, json.loads(r.stdout or "[]")


@pytest.fixture
def env(gpus: FakeGpus, fakenvml_lib: Path, tmp_path: Path) -> dict[str, str]:
    return babysitter_env(
        gpus,
        fakenvml_lib,
        tmp_path,
        checks__sdc__backend="numpy",
        checks__sdc__size="256",
        agent__spool_path=str(tmp_path / "state" / "spool.db"),
    )


def test_idle_gpus_run_and_report_gflops_per_device(env):
    code, found = sdc(env)
    assert code == 0
    summary = [f for f in found if f["code"] == "sdc.passed"]
    assert len(summary) == 1 and summary[0]["severity"] == "info"
    assert summary[0]["details"]["gflops"]["cpu:0"] > 0
    assert summary[0]["details"]["library"].startswith("numpy-")
    assert [f["code"] for f in found if f["component"] == "cpu"] == ["sdc.ok"]


def test_a_gpu_running_a_process_is_not_touched(env, gpus):
    gpus.set(3, procs=2)
    code, found = sdc(env)
    assert [f["code"] for f in found] == ["sdc.skipped_busy"]
    assert "GPUs [3] have compute processes" in found[0]["message"]
    assert code == 0  # nothing wrong with the node: the test waits for another time


def test_an_unreadable_process_list_counts_as_busy(env, gpus):
    gpus.error(5, "nvmlDeviceGetComputeRunningProcesses_v3", NVML_ERROR_UNKNOWN)
    _, found = sdc(env)
    assert [f["code"] for f in found] == ["sdc.skipped_unknown"]
    assert "busy state unknown" in found[0]["message"] and "GPU 5" in found[0]["message"]


def test_nvml_failing_to_start_on_a_gpu_node_counts_as_busy(env, gpus):
    gpus.set(init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    _, found = sdc(env)
    assert [f["code"] for f in found] == ["sdc.skipped_unknown"]
    assert "busy state unknown" in found[0]["message"]


def test_a_lost_gpu_counts_as_busy(env, gpus):
    gpus.lose(2)
    _, found = sdc(env)
    assert [f["code"] for f in found] == ["sdc.skipped_unknown"]
    assert "GPU 2 not reachable" in found[0]["message"]


def test_gpus_without_a_gpu_backend_are_not_reported_verified(env):
    """auto on a node with GPUs and neither cupy nor torch able to use them: no CPU run in
    their place, a warning that says what is missing."""
    code, found = sdc({**env, "BABYSITTER_CHECKS__SDC__BACKEND": "auto"})
    assert [f["code"] for f in found] == ["sdc.backend_unavailable"]
    assert found[0]["severity"] == "warning"
    assert "NVML shows 8 GPU(s) but no GPU backend" in found[0]["message"]
    assert code == 1


def test_an_injected_flip_is_a_critical_finding_that_drains(env):
    code, found = sdc({**env, "BABYSITTER_CHECKS__SDC__INJECT": "[0, 5, 7, 30]"})
    crit = [f for f in found if f["severity"] == "critical"]
    assert [(f["code"], f["component"], f["action"]) for f in crit] == [
        ("sdc.abft_mismatch", "cpu", "drain")
    ]
    assert [f["code"] for f in found if f["component"] == "host"] == ["sdc.failed"]
    assert code == 2
