"""docker/: what can be checked without a Docker engine (none runs on the test machines):
the compose file wires the documented services, the entrypoint passes shellcheck, and the
config the containers get is produced by the devcluster's own generator."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from babysitter.devcluster import config as conf
from babysitter.devcluster import container

DOCKER = Path(__file__).resolve().parents[1] / "docker"


def test_compose_services_are_wired():
    doc = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    svc = doc["services"]
    assert set(svc) == {
        "postgres",
        "alertmanager",
        "slurmctld",
        "node1",
        "node2",
        "node3",
        "controller",
    }
    for node in ("node1", "node2", "node3"):
        assert svc[node]["command"] == ["node"]
        assert svc[node]["environment"]["NODE_NAME"] == node
        assert svc[node]["hostname"] == node
        assert "/cluster" in " ".join(svc[node]["volumes"])
    assert svc["controller"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert svc["slurmctld"]["command"] == ["slurmctld"]
    assert svc["alertmanager"]["command"] == ["alertmanager"]
    assert svc["controller"]["build"]["dockerfile"] == "docker/Dockerfile"


def test_entrypoint_passes_shellcheck():
    r = subprocess.run(
        ["shellcheck", str(DOCKER / "entrypoint.sh")], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout


def test_entrypoint_roles_match_compose():
    text = (DOCKER / "entrypoint.sh").read_text()
    for role in ("slurmctld)", "node)", "controller)", "alertmanager)"):
        assert role in text
    assert "python -m babysitter.devcluster.container render" in text


def test_container_config_comes_from_the_devcluster_generator(tmp_path):
    container.render(tmp_path)
    spec = container.spec(tmp_path)
    slurm_conf = (tmp_path / "etc" / "slurm.conf").read_text()
    # the same function the devcluster uses, with the plugin lines it installed
    assert slurm_conf.startswith(conf.slurm_conf(spec).split("NodeName=")[0][:200])
    for node in container.NODES:
        assert f"NodeName={node} CPUs=8 RealMemory=16000 Gres=gpu:8" in slurm_conf
        assert (tmp_path / f"agent-{node}.toml").exists()
    assert "SlurmctldHost=slurmctld(slurmctld)" in slurm_conf
    assert "JobSubmitPlugins=lua" in slurm_conf  # the SPANK plugin and job_submit.lua
    assert (tmp_path / "etc" / "job_submit.lua").exists()
    from babysitter.config import load_config

    cfg = load_config(tmp_path / "controller.toml")  # valid against the real models
    assert cfg.alerts.alertmanager_url == "http://alertmanager:9093"
    agent = load_config(tmp_path / "agent-node2.toml")
    assert agent.agent.node_name == "node2"


def test_devcluster_and_containers_share_the_slurm_conf_keys(tmp_path):
    dev = conf.ClusterSpec(
        name="x",
        base=tmp_path / "d",
        controller_host="h",
        node_names=["node1"],
        node_ports=[7000],
        node_host="h",
    )

    def keys(text):
        return {
            ln.split("=")[0]
            for ln in text.splitlines()
            if "=" in ln and not ln.startswith(("NodeName", "#"))
        }

    assert keys(conf.slurm_conf(dev)) == keys(conf.slurm_conf(container.spec(tmp_path)))
