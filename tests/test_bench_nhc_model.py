"""The soak's model of NHC (bench/nhc_model.py) gives real NHC 1.4.3's verdict: on the same
simulated InfiniBand trees the soak writes (all ports up, each port down as an `ib_flap` leaves
it, two down, a port at a lower rate, a port training, no OFED ABI), the vendored NHC (run with
its `check_hw_ib` lines, /sys/class bound to the tree in a private mount namespace) and the model
pass and fail alike, with the same message. The GPU line (`check_nvsmi_healthmon`) is not
compared here: the soak's benign noise never loses a GPU or makes a DBE."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from babysitter.devcluster import simib
from bench.nhc import nhc_source
from bench.nhc_model import NhcArm, ib_verdict
from bench.soak import IB_PORTS, _ib_tree

CONF_LINES = ["* || check_fs_mount_rw -f /", "* || check_hw_physmem_free 1MB"]


def _can_bind_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount --bind /tmp /mnt"], capture_output=True, timeout=60
    )
    return r.returncode == 0


def _state(root: Path, name: str) -> None:
    """One of the sample states, written as the soak writes its nodes' trees."""
    _ib_tree(root)  # with infiniband_mad/abi_version, as a node with OFED loaded has
    if name == "no OFED ABI":
        (root / "sys" / "class" / "infiniband_mad" / "abi_version").unlink()
    if name.startswith("port down "):
        simib.set_port(root, f"mlx5_{name.split()[-1]}", 1, active=False)
    elif name == "two ports down":
        simib.set_port(root, "mlx5_0", 1, active=False)
        simib.set_port(root, "mlx5_7", 1, active=False)
    elif name == "port at 200 Gb/s":
        simib.set_port(root, "mlx5_2", 1, rate_gbps=200)
    elif name == "port training":
        d = simib.port_dir(root, "mlx5_5", 1)
        (d / "state").write_text("2: INIT\n")


STATES = [
    "all up",
    *[f"port down {i}" for i in range(IB_PORTS)],
    "two ports down",
    "port at 200 Gb/s",
    "port training",
    "no OFED ABI",
]


@pytest.mark.skipif(not _can_bind_mount(), reason="needs a private mount namespace (unshare -m)")
def test_model_and_real_nhc_give_the_same_verdicts(tmp_path: Path):
    src = nhc_source(tmp_path / "nhc")
    conf = tmp_path / "nhc.conf"
    lines = CONF_LINES + [f"* || check_hw_ib 400 mlx5_{i}:1" for i in range(IB_PORTS)]
    conf.write_text("\n".join(lines) + "\n")
    got = {}
    for i, name in enumerate(STATES):
        root = tmp_path / f"state{i}"
        _state(root, name)
        sys_class = root / "sys" / "class"
        nhc = (
            f"exec {src}/nhc -c {conf} -D {src} -t 60 HOSTNAME=node{i} LOGFILE=- "
            "ONLINE_NODE=: OFFLINE_NODE=: MARK_OFFLINE=0 DETACHED_MODE=0"
        )
        r = subprocess.run(
            ["unshare", "-m", "bash", "-c", f"mount --bind {sys_class} /sys/class && {nhc}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        real = None
        if r.returncode != 0:
            out = r.stdout + r.stderr
            assert "Health check failed:  " in out, out
            real = out.split("Health check failed:  ", 1)[1].splitlines()[0].strip()
        model = ib_verdict(sys_class, IB_PORTS)
        got[name] = (real, model)
    print("\n".join(f"{k}: {v[0]!r}" for k, v in got.items()))
    assert all(real == model for real, model in got.values()), got
    assert got["all up"] == (None, None)
    assert sum(real is not None for real, _ in got.values()) == len(STATES) - 1


def test_nhc_arm_drains_on_a_failed_run_and_resumes_on_the_next_clean_one():
    """A flap from t=100 to t=130: NHC every 60 s at phase 20 runs at 80 and 140 and never sees
    it; at phase 0 the run at 120 drains the node and the clean run at 180 resumes it."""
    arm = NhcArm(60.0, {"n1": 20.0, "n2": 0.0})
    assert arm.runs_between("n1", 100.0, 130.0) == [140.0]  # none inside, the next after
    assert arm.runs_between("n2", 100.0, 130.0) == [120.0, 180.0]
    arm.run("n2", 120.0, "check_hw_ib:  No IB port mlx5_1:1 is ACTIVE (LinkUp 400 Gb/sec).")
    arm.run("n2", 180.0, None)
    arm.run("n1", 140.0, None)
    arm.finish(1000.0)
    s = arm.summary(node_days=2.0)
    assert s["false_drains"] == 1 and s["drains"][0]["reason"].startswith("NHC: check_hw_ib")
    assert s["drain_minutes_max"] == pytest.approx(1.0)
    assert s["drains_open_at_end"] == 0
    assert s["false_drains_per_node_day"] == 0.5
