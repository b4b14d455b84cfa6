"""The product as users install it: the wheel, non-editable, in a fresh venv, run from a directory
outside the repository. Everything it reads at run time (migrations, the fake NVML source, the
Slurm plugin sources) must come from package data, never from a checkout.

The venv's third-party dependencies are cached by the dependency list (installing them is not
what this test is about); the babysitter wheel itself is rebuilt and reinstalled on every run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from babysitter.controller.api.auth import node_token
from bench.wheel import REPO, installed_wheel
from bench.wheel import clean_env as _clean_env
from tests.fixtures.controller import free_port


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return installed_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A working directory with no checkout anywhere above it."""
    d = tmp_path / "site"
    d.mkdir()
    assert not any((p / "pyproject.toml").exists() for p in [d, *d.parents])
    yield d


def _run(venv: Path, cwd: Path, *args: str, env: dict[str, str], timeout: float = 120):
    return subprocess.run(
        [str(venv / "bin" / "babysitter"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_installed_package_is_not_the_checkout(wheel_venv: Path, outside: Path):
    r = subprocess.run(
        [str(wheel_venv / "bin" / "python"), "-c", "import babysitter; print(babysitter.__file__)"],
        cwd=outside,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "site-packages" in r.stdout and str(REPO) not in r.stdout


def test_wheel_runs_controller_agent_and_check(wheel_venv: Path, outside: Path):
    secrets = outside / "etc"
    secrets.mkdir(mode=0o700)
    secret = b"wheel-test-cluster-secret-0123456789"
    for name, data in {
        "cluster.secret": secret,
        "admin.token": b"admin-token-0123456789abcdef",
        "node1.token": node_token(secret, "node1").encode(),
    }.items():
        fd = os.open(secrets / name, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, data)
        os.close(fd)
    port = free_port()
    db = f"sqlite:///{outside / 'bs.db'}"
    env = _clean_env(
        BABYSITTER_CONTROLLER__LISTEN=f"127.0.0.1:{port}",
        BABYSITTER_CONTROLLER__DATABASE_URL=db,
        BABYSITTER_CONTROLLER__CLUSTER_SECRET_FILE=str(secrets / "cluster.secret"),
        BABYSITTER_CONTROLLER__ADMIN_TOKEN_FILE=str(secrets / "admin.token"),
        BABYSITTER_CONTROLLER__REMEDIATION="false",
    )

    r = _run(wheel_venv, outside, "db", "upgrade", env=env)
    assert r.returncode == 0, r.stderr
    assert (outside / "bs.db").exists()

    # The fake GPUs come from the installed package's own C source.
    r = subprocess.run(
        [
            str(wheel_venv / "bin" / "python"),
            "-c",
            "from pathlib import Path; from babysitter.devcluster.fakenvml import build, FakeGpus;"
            "lib = build(Path('nvml-build')); FakeGpus(Path('nvml-state'), count=2);"
            "print(lib)",
        ],
        cwd=outside,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lib = r.stdout.strip()
    (outside / "kmsg").touch()
    node_env = _clean_env(
        FAKE_NVML_STATE=str(outside / "nvml-state"),
        LD_LIBRARY_PATH=lib,
        BABYSITTER_AGENT__KMSG_PATH=str(outside / "kmsg"),
        BABYSITTER_AGENT__NODE_NAME="node1",
        BABYSITTER_AGENT__CONTROLLER_URL=f"http://127.0.0.1:{port}",
        BABYSITTER_AGENT__TOKEN_FILE=str(secrets / "node1.token"),
        BABYSITTER_AGENT__SPOOL_PATH=str(outside / "spool.db"),
        BABYSITTER_AGENT__INTERVAL_S="1",
        BABYSITTER_CHECKS__HOST__CHECK_SLURMD="false",
        BABYSITTER_CHECKS__HOST__MIN_FREE_GB="0",
    )
    r = _run(wheel_venv, outside, "check", "--json", env=node_env)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    findings = json.loads(r.stdout)
    assert any(f["check"].startswith("gpu") for f in findings), findings

    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cmd, e in (("controller", env), ("agent", node_env)):
            procs.append(
                subprocess.Popen(
                    [str(wheel_venv / "bin" / "babysitter"), cmd],
                    cwd=outside,
                    env=e,
                    stdout=subprocess.DEVNULL,
                    stderr=open(outside / f"{cmd}.log", "wb"),  # noqa: SIM115
                )
            )
        nodes: list[dict] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), (outside / "controller.log").read_text()
            try:
                nodes = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/nodes",
                    headers={"Authorization": "Bearer admin-token-0123456789abcdef"},
                    timeout=2,
                ).json()
            except httpx.HTTPError:
                nodes = []
            if any(n["name"] == "node1" for n in nodes):
                break
            time.sleep(0.3)
        assert any(n["name"] == "node1" for n in nodes), (outside / "agent.log").read_text()
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=20)


def test_wheel_runs_devcluster_and_demo(wheel_venv: Path, outside: Path, slurm_daemons: str):
    """`babysitter devcluster up/down` and the demo, installed, build the Slurm plugin and the
    fake NVML library from package data."""
    base = outside / "cluster"
    env = _clean_env()
    r = _run(wheel_venv, outside, "devcluster", "up", "--nodes", "2", "--base", str(base),
             "--json", env=env, timeout=300)  # fmt: skip
    try:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        info = json.loads(r.stdout)
        assert info["nodes"] == ["node1", "node2"]
        sinfo = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"],
            env={**env, "SLURM_CONF": info["slurm_conf"]},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "node1 idle" in sinfo.stdout, sinfo.stdout + sinfo.stderr
    finally:
        down = _run(wheel_venv, outside, "devcluster", "down", "--base", str(base), env=env)
        assert down.returncode == 0, down.stderr

    # a short base: slurmstepd's unix socket path (spool/<node>/<node>_<job>.<step>) must stay
    # under 108 bytes, which a pytest tmp_path plus demo/sim/slurm/spool does not
    demo = Path(tempfile.mkdtemp(prefix="bs-demo-", dir="/tmp")) / "d"
    r = _run(wheel_venv, outside, "demo", "--base", str(demo), env=env, timeout=300)
    shutil.rmtree(demo.parent, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "demo ok" in r.stdout
    for needle in ("node drained", "job requeued", "alert sent", "node back in service"):
        assert needle in r.stdout
    assert not demo.exists()  # cleaned up
    left = subprocess.run(["pgrep", "-a", "-f", str(demo)], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
