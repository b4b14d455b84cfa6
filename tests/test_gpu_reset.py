"""The agent's side of the `reset_gpu` rung (babysitter/agent/reset.py) on simulated GPUs
through the real pynvml: it runs the site's reset command only for an idle GPU of a model that
supports it, and says why not otherwise (the controller then climbs to a reboot). The whole
loop, with the refusal that escalates, is in tests/test_self_healing.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from babysitter.devcluster.fakenvml import FakeGpus
from tests.fixtures.gpu import babysitter_env

RUN = """
import json, sys
from babysitter.agent.reset import carry_out
from babysitter.config import AgentConfig
args = json.loads(sys.argv[1])
print(json.dumps(carry_out(AgentConfig(**args["cfg"]), args["order"]).metric()))
"""


def reset(
    gpus: FakeGpus, lib: Path, tmp_path: Path, order: dict[str, Any], **cfg: Any
) -> tuple[dict[str, Any], bool]:
    """Carry out `order` in a process of its own on these GPUs; returns the outcome and
    whether the reset command ran (it touches a file)."""
    ran = tmp_path / "reset-ran"
    ran.unlink(missing_ok=True)
    cfg.setdefault("gpu_reset_command", ["sh", "-c", f"echo {{bus_id}} > {ran}"])
    r = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps({"cfg": cfg, "order": {"id": "o1", **order}})],
        env=babysitter_env(gpus, lib, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1]), ran.exists()


def test_an_idle_gpu_is_reset_by_the_sites_command(gpus, fakenvml_lib, tmp_path):
    # the order names the GPU by the bus id the kernel log spells (XID from kmsg)
    out, ran = reset(gpus, fakenvml_lib, tmp_path, {"bus_id": "0000:5d:00"})
    assert ran and out["ok"] and out["gpu"] == 3
    # the command got NVML's own spelling of that bus id
    assert (tmp_path / "reset-ran").read_text().strip() == out["bus_id"]
    assert out["message"].startswith("GPU 3 (")


def test_a_gpu_with_processes_is_not_reset(gpus, fakenvml_lib, tmp_path):
    gpus.set(3, procs=2)
    uuid = reset(gpus, fakenvml_lib, tmp_path, {"bus_id": "0000:5d:00"})[0]["uuid"]
    out, ran = reset(gpus, fakenvml_lib, tmp_path, {"uuid": uuid})
    assert not ran and out["refused"] and not out["ok"]
    assert out["message"] == "GPU reset refused: 2 process(es) still on GPU 3"


def test_a_model_without_single_gpu_reset_is_not_reset(gpus, fakenvml_lib, tmp_path):
    gpus.set(3, name="NVIDIA GeForce RTX 4090")
    out, ran = reset(gpus, fakenvml_lib, tmp_path, {"bus_id": "0000:5d:00"})
    assert not ran and out["refused"]
    assert "NVIDIA GeForce RTX 4090 does not support a single-GPU reset" in out["message"]


def test_processes_nvml_cannot_list_are_not_read_as_none(gpus, fakenvml_lib, tmp_path):
    gpus.error(3, "nvmlDeviceGetComputeRunningProcesses_v3", 999)
    out, ran = reset(gpus, fakenvml_lib, tmp_path, {"bus_id": "0000:5d:00"})
    assert not ran and out["refused"]
    assert "NVML cannot list the processes on GPU 3" in out["message"]


def test_a_gpu_not_on_the_node_is_refused(gpus, fakenvml_lib, tmp_path):
    out, ran = reset(gpus, fakenvml_lib, tmp_path, {"uuid": "GPU-not-here"})
    assert not ran and out["refused"] and "no GPU GPU-not-here on this node" in out["message"]
    out, ran = reset(gpus, fakenvml_lib, tmp_path, {})
    assert not ran and out["refused"] and "names no GPU" in out["message"]


def test_a_failing_or_hung_reset_command_is_a_failed_reset(gpus, fakenvml_lib, tmp_path):
    out, _ = reset(
        gpus,
        fakenvml_lib,
        tmp_path,
        {"bus_id": "0000:5d:00"},
        gpu_reset_command=["sh", "-c", "echo 'GPU is in use' >&2; exit 3"],
    )
    assert not out["ok"] and not out["refused"]
    assert out["message"] == "GPU reset of GPU 3 failed (exit 3): GPU is in use"
    out, _ = reset(
        gpus,
        fakenvml_lib,
        tmp_path,
        {"bus_id": "0000:5d:00"},
        gpu_reset_command=["sleep", "30"],
        gpu_reset_timeout_s=0.5,
    )
    assert not out["ok"] and out["message"] == "GPU reset of GPU 3 timed out after 0.5 s"
