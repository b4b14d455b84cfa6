"""`gpu.fabric` (issue 41, deliverable 2): the NVSwitch fabric of each GPU through the real
binding over the fake NVML, and the services that train and span it through stand-in
`systemctl` / `nvidia-imex-ctl` scripts; the verdicts themselves as pure functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from babysitter.checks.fabric import judge
from babysitter.devcluster import fakenvml
from babysitter.devcluster.fakenvml import health_mask
from babysitter.finding import Action, Severity
from tests.fixtures.gpu import babysitter_env, run_babysitter

STANDIN = Path(__file__).parent / "fixtures" / "standin_fabric"
CLUSTER = "5f0c1e2a-7b3d-4c8e-9a10-1234567890ab"


# ---- the verdicts (judge.py)
def test_untrained_fabric_is_info_within_the_grace_and_critical_past_it():
    v = judge.fabric_state(judge.NOT_STARTED, 0, pending_s=10, grace_s=300)
    assert v is not None and v.severity is Severity.INFO and v.code == "fabric.training"
    v = judge.fabric_state(judge.IN_PROGRESS, 0, pending_s=301, grace_s=300)
    assert v is not None and v.severity is Severity.CRITICAL and v.code == "fabric.not_trained"
    assert v.action is Action.DRAIN and "fabric" in v.message.lower()


def test_fabric_not_supported_says_nothing_and_completed_is_ok():
    assert judge.fabric_state(judge.NOT_SUPPORTED, 0, 1e6, 0) is None
    ok = judge.fabric_state(judge.COMPLETED, 0, 0, 300)
    assert ok is not None and ok.severity is Severity.OK


def test_a_training_status_error_is_critical():
    v = judge.fabric_state(judge.COMPLETED, 999, 0, 300)
    assert v is not None and v.severity is Severity.CRITICAL and v.code == "fabric.status_error"


def test_an_unknown_fabric_state_is_never_ok():
    v = judge.fabric_state(7, 0, 0, 300)
    assert v is not None and v.severity is Severity.WARNING


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        (health_mask(degraded_bw=True), [(Severity.WARNING, "fabric.degraded_bw")]),
        (health_mask(route_unhealthy=True), [(Severity.CRITICAL, "fabric.route_unhealthy")]),
        (health_mask(route_recovery=True), [(Severity.WARNING, "fabric.route_recovery")]),
        (
            health_mask(access_timeout_recovery=True),
            [(Severity.WARNING, "fabric.access_timeout_recovery")],
        ),
        (5 << 8, [(Severity.CRITICAL, "fabric.incorrect_configuration")]),
        # every sub-field supported and false, or none supported: nothing
        (health_mask(False, False, False, False) | (1 << 8), []),
        (0, []),
    ],
)
def test_health_mask(mask, expected):
    assert [(v.severity, v.code) for v in judge.health_mask(mask)] == expected


@pytest.mark.parametrize(
    ("answer", "severity", "code"),
    [
        ("active\n", Severity.OK, "fabric_manager.active"),
        ("activating\n", Severity.WARNING, "fabric_manager.starting"),
        ("failed\n", Severity.CRITICAL, "fabric_manager.down"),
        ("inactive\n", Severity.CRITICAL, "fabric_manager.down"),
        ("something-new\n", Severity.WARNING, "fabric_manager.unknown"),
        (None, Severity.WARNING, "fabric_manager.unknown"),  # systemctl failed: never ok
        ("", Severity.WARNING, "fabric_manager.unknown"),
    ],
)
def test_service_state(answer, severity, code):
    v = judge.service("nvidia-fabricmanager", answer, "fabric_manager")
    assert (v.severity, v.code) == (severity, code)


@pytest.mark.parametrize(
    ("output", "severity", "code"),
    [
        ('{"status": "UP", "nodes": {}}', Severity.OK, "imex.domain_up"),
        ('{"status": "DEGRADED", "nodes": {}}', Severity.WARNING, "imex.domain_degraded"),
        ('{"status": "DOWN", "nodes": {}}', Severity.CRITICAL, "imex.domain_down"),
        ('{"nodes": {}}', Severity.WARNING, "imex.domain_unknown"),
        ("Connection refused", Severity.WARNING, "imex.domain_unknown"),
        (None, Severity.WARNING, "imex.domain_unknown"),
    ],
)
def test_imex_domain(output, severity, code):
    v = judge.imex_domain(output)
    assert (v.severity, v.code) == (severity, code)


# ---- the check, one-shot, over the fake NVML and the stand-ins
@pytest.fixture
def run(gpus, fakenvml_lib, tmp_path):
    def go(*, fm: str | None = "active", imex: str | None = "active", domain="UP", **config):
        env = babysitter_env(
            gpus,
            fakenvml_lib,
            tmp_path,
            checks__fabric__systemctl=str(STANDIN / "systemctl"),
            checks__fabric__imex_ctl=str(STANDIN / "nvidia-imex-ctl"),
            **config,
        )
        for key, value in (
            ("STANDIN_nvidia_fabricmanager", fm),
            ("STANDIN_nvidia_imex", imex),
            ("STANDIN_IMEX_DOMAIN", domain),
        ):
            env.pop(key, None)
            if value is not None:
                env[key] = value
        r = run_babysitter(env, "check", "--json", "--only", "gpu.fabric")
        assert "Traceback" not in r.stderr, r.stderr
        return json.loads(r.stdout)

    return go


def faults(findings):
    return [f for f in findings if f["severity"] not in ("ok", "info")]


def test_fabric_not_started_on_one_gpu_of_an_nvswitch_system_is_critical(run, gpus):
    for i in range(8):
        gpus.fabric(i, fakenvml.FABRIC_COMPLETED)
    gpus.fabric(3, fakenvml.FABRIC_NOT_STARTED)
    # detected H100 SXM: an NVSwitch board; grace 0 (the host's uptime would do past 300 s)
    found = run(checks__fabric__grace_s="0")
    [f] = faults(found)
    assert f["component"] == "gpu3" and f["severity"] == "critical"
    assert f["code"] == "fabric.not_trained" and f["action"] == "drain"
    assert "NVLink fabric NOT_STARTED" in f["message"] and "GPU 3" in f["message"]
    # the driver reports a fabric: Fabric Manager is asked about, and it is up
    assert any(f["code"] == "fabric.services_ok" for f in found)


def test_the_same_state_on_a_profile_without_nvswitch_says_nothing(run, gpus):
    for i in range(8):
        gpus.fabric(i, fakenvml.FABRIC_NOT_STARTED)
    gpus.reset(8, "NVIDIA H100 PCIe")  # a PCIe card: no NVSwitch
    for i in range(8):
        gpus.fabric(i, fakenvml.FABRIC_NOT_STARTED)
    assert run(fm=None, checks__fabric__grace_s="0") == []
    assert run(fm=None, checks__fabric__grace_s="0", agent__hardware_profile="generic") == []


def test_gpus_without_a_fabric_on_a_detected_hgx_say_nothing_and_ask_no_service(run):
    # the fake's default: fabric NOT_SUPPORTED (a 4-GPU HGX without NVSwitch, an old driver)
    assert run(fm=None) == []


def test_health_mask_degraded_bandwidth_warns_and_route_unhealthy_is_critical(run, gpus):
    for i in range(8):
        gpus.fabric(i, fakenvml.FABRIC_COMPLETED, health=health_mask(False, False, False))
    gpus.fabric(1, fakenvml.FABRIC_COMPLETED, health=health_mask(degraded_bw=True))
    gpus.fabric(2, fakenvml.FABRIC_COMPLETED, health=health_mask(route_unhealthy=True))
    got = {(f["component"], f["code"], f["severity"]) for f in faults(run())}
    assert got == {
        ("gpu1", "fabric.degraded_bw", "warning"),
        ("gpu2", "fabric.route_unhealthy", "critical"),
    }


def test_fabric_manager_down_on_a_configured_hgx_is_critical(run, gpus):
    found = run(fm="failed", agent__hardware_profile="h100-sxm")
    [f] = faults(found)
    assert (f["component"], f["code"], f["severity"]) == ("host", "fabric_manager.down", "critical")
    assert "nvidia-fabricmanager failed" in f["message"]


def test_systemctl_failing_is_unknown_never_ok(run):
    found = run(fm=None, agent__hardware_profile="h100-sxm")
    [f] = faults(found)
    assert (f["code"], f["severity"]) == ("fabric_manager.unknown", "warning")
    assert not any(f["severity"] == "ok" for f in found)


def test_nvl72_imex_domain_down_is_critical_and_carries_the_nvlink_domain(run, gpus):
    gpus.reset(4, "NVIDIA GB200")
    for i in range(4):
        gpus.fabric(i, fakenvml.FABRIC_COMPLETED, clique=2, cluster=CLUSTER)
    found = run(fm=None, domain="DOWN", agent__hardware_profile="gb200-nvl72")
    [f] = faults(found)
    assert (f["code"], f["severity"]) == ("imex.domain_down", "critical")
    oks = [f for f in found if f["code"] == "fabric.ok"]
    assert len(oks) == 4
    assert {f["details"]["nvlink_domain"] for f in oks} == {f"{CLUSTER}/2"}


def test_imex_garbled_answer_is_unknown(run, gpus):
    gpus.reset(4, "NVIDIA GB200")
    for i in range(4):
        gpus.fabric(i, fakenvml.FABRIC_COMPLETED, clique=2, cluster=CLUSTER)
    found = run(fm=None, domain="garbled", agent__hardware_profile="gb200-nvl72")
    assert [(f["code"], f["severity"]) for f in faults(found)] == [
        ("imex.domain_unknown", "warning")
    ]


def test_no_fabric_state_on_a_configured_nvl72_tray_is_unknown_never_nothing(run, gpus):
    """A configured NVL72 tray has an NVSwitch fabric and no Fabric Manager of its own: the GPU
    fabric state is its only fabric evidence, so a driver answering NOT_SUPPORTED there is
    unknown (a warning), never a silent pass."""
    gpus.reset(4, "NVIDIA GB200")  # the fake's default fabric state: NOT_SUPPORTED
    found = run(fm=None, agent__hardware_profile="gb200-nvl72")
    got = {(f["component"], f["code"], f["severity"]) for f in faults(found)}
    assert got == {(f"gpu{i}", "fabric.state_unknown", "warning") for i in range(4)}
    v = judge.fabric_state(judge.NOT_SUPPORTED, 0, 0, 300, required=True)
    assert v is not None and v.severity is Severity.WARNING


def test_a_detected_gb200_never_alarms_on_imex(run, gpus):
    """A single GB200 node is no multi-node NVLink domain (NVSentinel#1471): without a
    configured profile IMEX is not asked about, even when it is not running."""
    gpus.reset(4, "NVIDIA GB200")
    for i in range(4):
        gpus.fabric(i, fakenvml.FABRIC_COMPLETED)
    assert faults(run(fm=None, imex="inactive", domain=None)) == []


# ---- NVLink states other than plain active (gpu.nvlink)
def test_nvlink_states_are_judged_explicitly(gpus, fakenvml_lib, tmp_path):
    gpus.nvlink_state(0, 2, fakenvml.NVLINK_SLEEP)
    gpus.nvlink_state(1, 5, fakenvml.NVLINK_ACTIVE_TRAFFIC_DISABLED)
    gpus.nvlink_state(2, 7, 9)
    gpus.nvlink_state(3, 1, fakenvml.NVLINK_INACTIVE)
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    r = run_babysitter(env, "check", "--json", "--only", "gpu.nvlink")
    assert "Traceback" not in r.stderr, r.stderr
    got = {(f["component"], f["code"], f["severity"]) for f in faults(json.loads(r.stdout))}
    assert got == {
        ("nvlink:gpu1/5", "nvlink.traffic_disabled", "warning"),
        ("nvlink:gpu2/7", "nvlink.state_unknown", "warning"),
        ("nvlink:gpu3/1", "nvlink.inactive", "critical"),
    }  # SLEEP on GPU 0: up, nothing said


# ---- end to end: a real Slurm devcluster, the controller, an agent per node on fake GPUs
def test_an_untrained_fabric_drains_the_node_naming_the_fabric(tmp_path, receiver, slurm_daemons):
    from babysitter.devcluster.sim import SimCluster
    from tests.fixtures.slurm import node_state, wait_for

    sim = SimCluster(
        tmp_path / "sim",
        n_nodes=2,
        webhook_url=receiver.url + "/hook",
        # grace 0: a fabric NOT_STARTED is critical at once (the host may have booted < 300 s
        # ago); Fabric Manager is not asked about (no systemctl in the simulated nodes)
        env={
            "BABYSITTER_CHECKS__FABRIC__GRACE_S": "0",
            "BABYSITTER_CHECKS__FABRIC__FABRIC_MANAGER": "false",
            "BABYSITTER_CHECKS__FABRIC__INTERVAL_S": "1",
        },
    )
    sim.up()
    try:
        wait_for(
            lambda: [n["verdict"] for n in sim.api("/api/v1/nodes")] == ["healthy", "healthy"],
            90,
            "2 healthy nodes",
        )
        # an HGX H100 (detected: an NVSwitch board): GPU 5's fabric never trained
        gpus = sim.nodes["node1"].gpus
        for i in range(8):
            gpus.fabric(i, fakenvml.FABRIC_COMPLETED)
        gpus.fabric(5, fakenvml.FABRIC_NOT_STARTED)
        wait_for(lambda: node_state(sim.info, "node1")[0] in ("drain", "drng"), 60, "drained")
        _, reason = node_state(sim.info, "node1")
        assert reason.startswith("babysitter: ") and "gpu.fabric" in reason
        assert "NVLink fabric NOT_STARTED" in reason
        assert node_state(sim.info, "node2")[0] == "idle"
    finally:
        sim.down()
