"""The one-shot's ctypes NVML binding (checks/nvml_lite.py) against the real pynvml: the same
checks, run through each binding over the same fake libnvidia-ml, find exactly the same things
(codes, severities, messages, details), for healthy GPUs and for every kind of fault and error
the GPU checks read."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from babysitter.devcluster import fakenvml
from tests.fixtures.gpu import babysitter_env

# Runs in a child (one fake library per process): the default GPU checks through pynvml, then
# through the lite binding, each with fresh check instances and a new NVML session.
PROBE = """
import json, sys
from babysitter.checks import nvml
from babysitter.checks.all import select_checks
from babysitter.checks.base import CheckContext, run_checks
from babysitter.config import load_config

cfg = load_config()
out = {}
for binding in sys.argv[1:]:
    nvml.use(binding)
    checks = select_checks(CheckContext(cfg, "n1"), ["gpu"])
    found = [f.to_json_dict() for r in run_checks(checks) for f in r.findings]
    for f in found:
        f.pop("observed_at", None)
    out[binding] = {"findings": found, "pynvml_loaded": "pynvml" in sys.modules}
print(json.dumps(out))
"""


def both(env: dict[str, str], *order: str) -> dict[str, dict]:
    r = subprocess.run(
        [sys.executable, "-c", PROBE, *order], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def faults(gpus: fakenvml.FakeGpus) -> None:
    """Every signal of the default GPU checks off its healthy value on some GPU."""
    gpus.set(0, retired_pending=1, retired_sbe=3, pcie_gen=3)
    gpus.set(1, retired_dbe=62, nvlink_down="4,17")
    gpus.set(2, sbe_volatile=20_000, dbe_volatile=2, pcie_width=8)
    gpus.set(3, dbe_aggregate=2, clocks_event_reasons=0x20)
    gpus.set(4, temp=88, temp_slowdown=90, temp_shutdown=95, util=77)
    gpus.set(5, temp=96, temp_slowdown=90, temp_shutdown=95, clocks_event_reasons=0x48)
    gpus.set(6, remap_failure=1, remap_corr=4)
    gpus.set(7, remap_pending=1, remap_unc=513)


CASES = {
    "healthy": lambda g: None,
    "every signal faulty": faults,
    "a lost GPU": lambda g: g.lose(5),
    "a driver without the NVLink state field": lambda g: [
        g.set(i, nvlink_fields=0, nvlink_down="3" if i == 2 else None) for i in range(8)
    ],
    "NOT_SUPPORTED and other NVML errors": lambda g: [
        g.error(4, "nvmlDeviceGetRemappedRows", fakenvml.NOT_SUPPORTED),
        g.error(4, "nvmlDeviceGetTemperature", fakenvml.NOT_SUPPORTED),
        g.error(3, "nvmlDeviceGetTotalEccErrors", 999),
        g.error(6, "nvmlDeviceGetFieldValues", 17),
    ],
    "the driver not loaded": lambda g: g.set(init_error=9),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lite_binding_finds_what_pynvml_finds(case, gpus, fakenvml_lib, tmp_path):
    CASES[case](gpus)
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    got = both(env, "lite", "pynvml")
    assert got["lite"]["findings"] == got["pynvml"]["findings"]
    assert got["lite"]["findings"], "the GPU checks reported nothing"
    # the lite run really ran without pynvml (it is loaded only once the second run asks)
    assert not got["lite"]["pynvml_loaded"]
    if case != "healthy":
        assert any(f["severity"] != "ok" for f in got["lite"]["findings"])


LOST_MID_RUN = """
import json, os, sys
from pathlib import Path
from babysitter.checks import nvml
from babysitter.checks.all import select_checks
from babysitter.checks.base import CheckContext, execute
from babysitter.config import load_config
from babysitter.devcluster.fakenvml import FakeGpus

nvml.use(sys.argv[1])
[check] = select_checks(CheckContext(load_config(), "n1"), ["gpu.memory"])
nvml.devices()  # the list the GPU checks reuse for a few seconds (DEVICE_LIST_MAX_AGE_S)
FakeGpus(Path(os.environ["FAKE_NVML_STATE"])).lose(3)  # falls off the bus after the listing
print(json.dumps([(f.component, f.code) for f in execute(check).findings]))
"""


@pytest.mark.parametrize("binding", ["lite", "pynvml"])
def test_a_gpu_lost_after_the_listing_is_left_to_gpu_presence(
    binding, gpus, fakenvml_lib, tmp_path
):
    """A GPU that falls off the bus between the device listing and its reads: the other checks
    skip it (gpu.presence reports it) and still report every other GPU; the check does not
    fail as a whole (it did: the code named an exception class pynvml does not have)."""
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", LOST_MID_RUN, binding],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    found = [tuple(f) for f in json.loads(r.stdout)]
    assert found == [(f"gpu{i}", "memory.ok") for i in range(8) if i != 3]
