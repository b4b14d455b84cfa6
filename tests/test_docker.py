"""docker/: the dockerized Slurm test cluster, built and run for real. The image comes from the
debootstrapped Debian root (no registry) with the project installed from its wheel by
docs/deploy.md's own steps (docker/guide.py); the containers set babysitter up with the guide's
database, controller and node steps; compose starts slurmctld, three nodes (slurmd + agent over
the fake NVML), the controller on Postgres and Alertmanager, all with host networking. The
guide's verification and backup steps then run in the live cluster. An XID 79 written into
node2's fake NVML state drains node2 and fires an alert; a reboot of node2 (container restart)
resumes it. Whatever happens, teardown leaves no container, network or mount behind.

Needs root and a Docker engine: `make setup` installs docker.io; the test starts its own dockerd
(docker/cluster.py) when none runs and stops it again afterwards."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import yaml

from babysitter.devcluster import config as conf
from babysitter.devcluster import container
from tests.fixtures.slurm import wait_for

DOCKER = Path(__file__).resolve().parents[1] / "docker"
COLD_TIMEOUT_S = 3600  # a cold run debootstraps the root and builds the image (~10 min here)


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("babysitter_docker_tool", DOCKER / "cluster.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


tool = _load_tool()


# ---- the cluster for real


@pytest.fixture(scope="module")
def docker_engine() -> Iterator[None]:
    """A Docker engine; the one this fixture starts, it stops (with a check for mounts)."""
    if os.geteuid() != 0:
        pytest.fail("the docker test cluster needs root (dockerd, debootstrap)")
    started = tool.daemon_up()
    try:
        yield
    finally:
        tool.down()
        if started:
            tool.daemon_down()


@pytest.fixture(scope="module")
def image(docker_engine: None) -> str:
    ref, _ = tool.image()
    return str(ref)


def _assert_nothing_left() -> None:
    assert tool.containers() == []
    assert tool.docker("ps", "-a", "-q").split() == []
    nets = tool.docker("network", "ls", "--format", "{{.Name}}").split()
    assert sorted(nets) == ["host", "none"]  # no project network (and no docker0: --bridge=none)
    assert tool.leftover_mounts() == []


def _sinfo(node: str) -> tuple[str, str]:
    out = tool.docker(
        "exec", tool.service("slurmctld"), "sinfo", "-h", "-N", "-n", node, "-o", "%t|%E"
    ).strip()
    state, reason = out.split("|", 1)
    return state.rstrip("*"), reason


def _api(path: str) -> object:
    """The controller's API over HTTPS, verified with the CA the guide's TLS step made."""
    token = (tool.STATE_DIR / "admin.token").read_text().strip()
    r = httpx.get(
        f"{container.site_values()['CONTROLLER_URL']}{path}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
        verify=ssl.create_default_context(cafile=str(tool.STATE_DIR / "ca.pem")),
    )
    r.raise_for_status()
    return r.json()


def _alerts(node: str) -> list[dict[str, object]]:
    r = httpx.get(f"http://127.0.0.1:{container.PORTS['alertmanager']}/api/v2/alerts", timeout=5)
    r.raise_for_status()
    return [a for a in r.json() if a["labels"].get("node") == node]


def _guide_step(service: str, step: str) -> str:
    """Run one of docs/deploy.md's steps in a live container, with the cluster's site values."""
    env = [f"{k}={v}" for k, v in container.site_values().items()]
    args = [a for kv in env for a in ("-e", kv)]
    return str(
        tool.docker(
            "exec", *args, tool.service(service), "bash", f"/opt/babysitter-guide/{step}.sh",
            timeout=120,
        )
    )  # fmt: skip


@pytest.mark.timeout(COLD_TIMEOUT_S)
def test_second_image_build_builds_nothing(image: str):
    ref, built = tool.image()
    assert (ref, built) == (image, False)
    labels = json.loads(tool.docker("image", "inspect", "-f", "{{json .Config.Labels}}", ref))
    assert ref.endswith(labels["org.babysitter.content"][:16])
    # the project is in the image as a wheel install, not an editable checkout
    out = tool.docker(
        "run", "--rm", "--network=host", "--entrypoint", "/opt/babysitter/bin/pip", ref,
        "show", "-f", "babysitter",
    )  # fmt: skip
    assert "Location: /opt/babysitter/lib/" in out and "Editable project location" not in out
    # the guide's install and plugin steps put the packaged units and the plugin in place
    installed = tool.docker(
        "run", "--rm", "--network=host", "--entrypoint", "cat", ref,
        "/etc/systemd/system/babysitter-agent.service", "/usr/local/sbin/babysitter-healthcheck",
        "/etc/slurm/job_submit.lua",
    )  # fmt: skip
    repo = DOCKER.parent
    assert installed == "".join(
        (repo / f).read_text()
        for f in (
            "systemd/babysitter-agent.service",
            "systemd/babysitter-healthcheck",
            "slurm-plugins/job_submit.lua",
        )
    )
    tool.docker(
        "run", "--rm", "--network=host", "--entrypoint", "test", ref,
        "-s", "/usr/lib/x86_64-linux-gnu/slurm-wlm/babysit_spank.so",
    )  # fmt: skip


@pytest.mark.timeout(COLD_TIMEOUT_S)
def test_xid79_drains_node2_alerts_and_resumes(image: str):
    try:
        tool.up(image)
        wait_for(lambda: all(_sinfo(n)[0] == "idle" for n in container.NODES), 90, "3 idle nodes")
        wait_for(
            lambda: [n["verdict"] for n in _api("/api/v1/nodes")] == ["healthy"] * 3,  # type: ignore[attr-defined]
            90,
            "3 healthy nodes",
        )
        # the guide's checks after start-up, and its backup, in the live cluster
        _guide_step("controller", "verify-controller")
        _guide_step("node1", "verify-node")
        _guide_step("controller", "backup")
        dumps = tool.docker(
            "exec", tool.service("controller"), "sh", "-c", "ls /var/backups/babysitter/*.dump"
        ).split()
        assert len(dumps) == 1
        listing = tool.docker("exec", tool.service("controller"), "pg_restore", "-l", dumps[0])
        assert "TABLE public nodes" in listing and "TABLE DATA public alembic_version" in listing

        tool.inject("node2", 3, 79)
        wait_for(lambda: _sinfo("node2")[0] in ("drain", "drng"), 60, "node2 drained")
        _, reason = _sinfo("node2")
        assert reason.startswith("babysitter: ") and "XID 79" in reason
        wait_for(
            lambda: any(a["status"]["state"] == "active" for a in _alerts("node2")),  # type: ignore[index]
            60,
            "node2's alert in Alertmanager",
        )
        assert [_sinfo(n)[0] for n in ("node1", "node3")] == ["idle", "idle"]

        # a reboot of node2: its container restarts with healthy GPUs and an empty kernel log
        tool.docker("restart", "-t", "5", tool.service("node2"))
        wait_for(lambda: _sinfo("node2")[0] == "idle", 90, "node2 resumed")
        wait_for(
            lambda: not any(a["status"]["state"] == "active" for a in _alerts("node2")),  # type: ignore[index]
            60,
            "node2's alert resolved",
        )
        node = _api("/api/v1/nodes/node2")
        assert node["verdict"] == "healthy" and not node["babysitter_drained"]  # type: ignore[index]
    except BaseException:
        print(tool.logs(), file=sys.stderr)  # what the containers said, for the report
        raise
    finally:
        tool.down()
    _assert_nothing_left()


@pytest.mark.timeout(COLD_TIMEOUT_S)
def test_failure_midway_leaves_nothing_behind(image: str):
    """The teardown path the tests use runs after a failure half-way through a bring-up."""
    with pytest.raises(RuntimeError, match="midway"):
        try:
            # the first three services: enough containers and mounts to leave behind
            tool.up(image, services=["postgres", "slurmctld", "alertmanager"])
            assert len(tool.containers()) == 3
            assert tool.leftover_mounts()  # their root file systems: what must not stay
            raise RuntimeError("failing midway")
        finally:
            tool.down()
    _assert_nothing_left()


# ---- what the containers are given


def test_compose_file_wires_the_documented_services():
    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    svc = doc["services"]
    assert set(svc) == {"postgres", "alertmanager", "slurmctld", "controller"} | set(
        container.NODES
    )
    for name, s in svc.items():
        assert s["network_mode"] == "host", name
        assert any(v.endswith(":/cluster") for v in s["volumes"]), name
    for node in container.NODES:
        assert svc[node]["command"] == ["node"]
        assert svc[node]["environment"]["NODE_NAME"] == node
    ctl = svc["controller"]["depends_on"]
    assert ctl["postgres"]["condition"] == "service_healthy"
    # health checks probe the ports the config generator gives the daemons
    assert str(container.PORTS["postgres"]) in svc["postgres"]["healthcheck"]["test"]
    assert str(container.PORTS["controller"]) in " ".join(svc["controller"]["healthcheck"]["test"])


def test_entrypoint_passes_shellcheck():
    r = subprocess.run(
        ["shellcheck", str(DOCKER / "entrypoint.sh")], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout


def _env_file(path: Path) -> dict[str, str]:
    """KEY='value' lines, read as a shell (or systemd's EnvironmentFile) reads them."""
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        (out[key],) = shlex.split(value)
    return out


def test_container_config_comes_from_the_devcluster_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    container.render(tmp_path)
    spec = container.spec(tmp_path)
    slurm_conf = (tmp_path / "etc" / "slurm.conf").read_text()
    assert slurm_conf.startswith(conf.slurm_conf(spec).split("NodeName=")[0][:200])
    for i, node in enumerate(container.NODES):
        port = container.PORTS["slurmd"] + i
        assert f"NodeName={node} NodeHostname={spec.node_host} NodeAddr=127.0.0.1 Port={port}" in (
            slurm_conf
        )
    assert f"SlurmctldPort={container.PORTS['slurmctld']}" in slurm_conf
    site = _env_file(tmp_path / "site.env")
    assert site["CONTROLLER_URL"] == f"https://localhost:{container.PORTS['controller']}"
    assert site["DB_PORT"] == str(container.PORTS["postgres"])
    assert site["ALERTMANAGER_URL"] == f"http://127.0.0.1:{container.PORTS['alertmanager']}"
    # no secret is made here: the guide's controller step makes them in the controller
    assert not list(tmp_path.glob("*.token")) and not (tmp_path / "cluster.secret").exists()

    from babysitter.config import load_config

    empty = tmp_path / "empty.toml"
    empty.write_text("")
    # the simulation's settings are valid BABYSITTER_* overrides of the real models
    for name in ("controller.env", "agent-node2.env"):
        with monkeypatch.context() as m:
            for k, v in _env_file(tmp_path / name).items():
                m.setenv(k, v)
            cfg = load_config(empty)
        assert cfg.slurm.slurm_conf == tmp_path / "etc" / "slurm.conf"
        if name == "controller.env":
            assert cfg.controller.loop_interval_s == 0.5
        else:
            assert cfg.agent.sysfs_root == Path("/var/lib/babysitter/node2/sysfs")
            assert cfg.checks.host.paths == [Path("/var/lib/babysitter/node2")]


def test_ports_stay_clear_of_devclusters_and_host_services():
    ports = set(container.PORTS.values()) | {
        container.PORTS["slurmd"] + i for i in range(len(container.NODES))
    }
    assert all(p < 20000 for p in ports)  # devclusters pick theirs from 20000 up
    assert not ports & {5432, 6817, 6818, 8090, 9093}
