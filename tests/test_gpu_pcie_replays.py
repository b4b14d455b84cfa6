"""gpu.pcie/replays: PCIe replays climbing faster than the threshold warn on the GPU whose link
retransmits, read from the fake libnvidia-ml through each NVML binding (pynvml in the agent,
the lite one in `babysitter check`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fixtures.gpu import babysitter_env

# A child process (one fake library per process): one check instance reads every GPU, the test
# raises GPU 6's replay counter, and the same instance reads again a minute later by its clock.
PROBE = """
import json, os, sys
from pathlib import Path
from babysitter.checks import nvml
from babysitter.checks.base import CheckContext
from babysitter.checks.gpu.check import GpuPcieCheck
from babysitter.config import load_config

nvml.use(sys.argv[1])
now = [1000.0]
chk = GpuPcieCheck(CheckContext(load_config(), "n1"))
chk.clock = lambda: now[0]

def read():
    devs, _ = nvml.devices()
    return [f.to_json_dict() for d in devs for f in chk.read("replays", d)]

first = read()
state = Path(sys.argv[2])
fields = dict(line.split("=", 1) for line in state.read_text().splitlines())
fields.update(json.loads(sys.argv[3]))
tmp = state.with_name("state.new")
tmp.write_text("".join(f"{k}={v}\\n" for k, v in fields.items()))
os.replace(tmp, state)  # atomically: the fake must not read a torn file
now[0] += 60.0
print(json.dumps({"first": first, "second": read()}))
"""


def replays(env: dict[str, str], binding: str, state: str, later: dict[str, int]) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", PROBE, binding, state, json.dumps(later)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("binding", ["pynvml", "lite"])
def test_replays_climbing_past_the_threshold_warn_on_that_gpu(
    binding, gpus, fakenvml_lib, tmp_path
):
    gpus.set(6, pcie_replays=1_000)  # old replays: a count alone says nothing
    gpus.set(2, pcie_replays=50)
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    # a minute later: GPU 6 replayed 120 more times (2 a second), GPU 2 five more (under 8)
    got = replays(
        env, binding, str(gpus.path), {"gpu6.pcie_replays": 1120, "gpu2.pcie_replays": 55}
    )
    assert got["first"] == []  # the first read is only the baseline
    [f] = got["second"]
    assert (f["component"], f["code"], f["severity"]) == ("gpu6", "pcie.replays", "warning")
    assert f["details"]["replays"] == 120 and f["details"]["per_min"] == 120.0
    assert "120 PCIe replays a minute" in f["message"] and f["message"].startswith("GPU 6")


def test_the_threshold_is_configuration(gpus, fakenvml_lib, tmp_path):
    env = babysitter_env(
        gpus, fakenvml_lib, tmp_path, checks__gpu__thresholds__pcie_replays_per_min_warn="200"
    )
    got = replays(env, "lite", str(gpus.path), {"gpu6.pcie_replays": 120})
    assert got == {"first": [], "second": []}
