"""`babysitter check --slurm-drain` as a HealthCheckProgram on a real devcluster node."""

from __future__ import annotations

from pathlib import Path

from babysitter.slurm.cli import CliSlurmClient
from tests.fixtures.gpu import babysitter_env, run_babysitter
from tests.fixtures.slurm import node_state, slurm


def test_drains_on_critical_resumes_when_clean_and_leaves_admin_drains(
    clean_cluster, gpus, fakenvml_lib, tmp_path
):
    env = babysitter_env(gpus, fakenvml_lib, tmp_path, agent__node_name="node2")
    env["SLURM_CONF"] = clean_cluster.slurm_conf

    gpus.set(3, dbe_volatile=1)
    r = run_babysitter(env, "check", "--slurm-drain", "--only", "gpu")
    assert r.returncode == 2
    state, reason = node_state(clean_cluster, "node2")
    assert state == "drain"
    assert reason.startswith("babysitter: [healthcheck] gpu.memory: GPU 3")

    gpus.set(3, dbe_volatile=0)
    r = run_babysitter(env, "check", "--slurm-drain", "--only", "gpu")
    assert r.returncode == 0
    assert node_state(clean_cluster, "node2")[0] == "idle"

    # an admin's drain is never touched
    env["BABYSITTER_AGENT__NODE_NAME"] = "node3"
    slurm(
        clean_cluster,
        "scontrol",
        "update",
        "NodeName=node3",
        "State=DRAIN",
        "Reason=admin maintenance",
    )
    gpus.set(3, dbe_volatile=1)
    r = run_babysitter(env, "check", "--slurm-drain", "--only", "gpu")
    assert r.returncode == 2
    assert "left node3 alone" in r.stderr
    assert node_state(clean_cluster, "node3") == ("drain", "admin maintenance")
    gpus.set(3, dbe_volatile=0)
    r = run_babysitter(env, "check", "--slurm-drain", "--only", "gpu")
    assert r.returncode == 0
    assert node_state(clean_cluster, "node3") == ("drain", "admin maintenance")


def test_check_never_resumes_a_controller_drain(clean_cluster, gpus, fakenvml_lib, tmp_path):
    """The controller drained node2 for an NVML event (an XID the one-shot check never sees):
    a clean `check --slurm-drain` run leaves it drained; only the controller resumes it."""
    env = babysitter_env(gpus, fakenvml_lib, tmp_path, agent__node_name="node2")
    env["SLURM_CONF"] = clean_cluster.slurm_conf
    reason = "xid.nvml: XID 79 on GPU 3 (reboot: node fault)"
    CliSlurmClient(slurm_conf=Path(clean_cluster.slurm_conf)).drain("node2", reason)
    r = run_babysitter(env, "check", "--slurm-drain", "--only", "gpu")
    assert r.returncode == 0  # every one-shot check is clean
    assert "left node2 alone" in r.stderr
    assert node_state(clean_cluster, "node2") == ("drain", f"babysitter: {reason}")
    # a critical finding now does not rewrite the controller's reason as the check's own
    gpus.set(3, dbe_volatile=1)
    r = run_babysitter(env, "check", "--slurm-drain", "--only", "gpu")
    assert r.returncode == 2 and "drained by the babysitter controller" in r.stderr
    gpus.set(3, dbe_volatile=0)
    r = run_babysitter(env, "check", "--slurm-drain", "--only", "gpu")
    assert node_state(clean_cluster, "node2") == ("drain", f"babysitter: {reason}")


def test_a_check_without_a_verdict_never_resumes_the_checks_own_drain(
    clean_cluster, gpus, fakenvml_lib, tmp_path
):
    """Unknown is not ok: a check that could not read (NVML answers an unknown error) says
    nothing about the node, so the drain this mode made stays until a run where every check
    has a verdict."""
    env = babysitter_env(gpus, fakenvml_lib, tmp_path, agent__node_name="node2")
    env["SLURM_CONF"] = clean_cluster.slurm_conf
    gpus.set(3, dbe_volatile=1)
    assert run_babysitter(env, "check", "--slurm-drain", "--only", "gpu").returncode == 2
    assert node_state(clean_cluster, "node2")[0] == "drain"

    gpus.set(3, dbe_volatile=0)
    gpus.error(3, "nvmlDeviceGetTotalEccErrors", 999)  # NVML_ERROR_UNKNOWN: no verdict
    r = run_babysitter(env, "check", "--slurm-drain", "--only", "gpu")
    assert r.returncode == 3
    assert "kept node2 drained: no verdict from gpu.memory" in r.stderr
    state, reason = node_state(clean_cluster, "node2")
    assert state == "drain" and reason.startswith("babysitter: [healthcheck] gpu.memory")

    gpus.error(3, "nvmlDeviceGetTotalEccErrors", None)
    assert run_babysitter(env, "check", "--slurm-drain", "--only", "gpu").returncode == 0
    assert node_state(clean_cluster, "node2")[0] == "idle"
