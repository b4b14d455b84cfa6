"""The `restart_fabric` rung (issue 41, deliverable 2): an untrained NVLink fabric, Fabric
Manager or IMEX down climbs "restart the service" before a reboot. The healer's steps through
the real engine over the in-memory Slurm (tests/fixtures/healing.py); the agent's side with a
stand-in systemctl."""

from __future__ import annotations

from pathlib import Path

import pytest

from babysitter.agent import fabric_restart
from babysitter.config import RemediationConfig, parse_config
from babysitter.controller.api.orders import OrderBook
from babysitter.controller.db.actions import ActionKind
from babysitter.controller.loop.decide.ladder import LadderTable, Rung, remediable
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.read.ledger import Phase
from babysitter.finding import Action, Finding
from tests.fixtures.healing import Cluster, imex_down, not_trained

STANDIN = Path(__file__).parent / "fixtures" / "standin_fabric"


# ---- the ladder
def test_fabric_faults_restart_the_service_before_a_reboot():
    table = LadderTable.from_config(RemediationConfig())
    for code in ("fabric.not_trained", "fabric_manager.down", "imex.domain_down"):
        assert table.rungs(code, Action.DRAIN) == (Rung.RESTART_FABRIC, Rung.REBOOT, Rung.INSPECT)
    assert remediable(not_trained()) and remediable(imex_down())
    warning = not_trained().replace(severity="warning", code="fabric.degraded_bw")
    assert not remediable(warning)  # slower, not broken: no rung


def test_a_site_can_skip_the_restart():
    table = LadderTable.from_config(
        RemediationConfig(ladder={"fabric.not_trained": ["reboot", "inspect"]})
    )
    assert table.first("fabric.not_trained", Action.DRAIN) is Rung.REBOOT


# ---- the healer
def _ordered(c: Cluster, finding: Finding) -> dict:
    c.report("node1", finding)
    for _ in range(2):
        c.tick()
    [row] = c.ledger("node1")
    assert row.rung is Rung.RESTART_FABRIC and row.state is Phase.RESETTING, row
    book = OrderBook(c.store, sdc=False)
    book.refresh()
    assert b'"check":"fabric.restart"' in book.answer_part("node1")
    return row.evidence


def test_an_untrained_fabric_is_drained_naming_it_then_fabric_manager_restarted(tmp_path):
    c = Cluster(tmp_path)
    c.tick()
    ev = _ordered(c, not_trained(3))
    assert ev["units"] == ["nvidia-fabricmanager"]
    reason = c.slurm.node("node1").reason
    assert "gpu.fabric" in reason and "NVLink fabric NOT_STARTED" in reason
    done = {"order": ev["order_id"], "ok": True, "message": "nvidia-fabricmanager restarted"}
    c.report("node1", fabric_restart=done)
    c.tick()
    [row] = c.ledger("node1")
    assert row.state is Phase.VALIDATING and row.rung is Rung.RESTART_FABRIC
    kinds = [a.kind for a in c.store.actions() if a.node == "node1"]
    assert kinds.count(ActionKind.RESTART_FABRIC) == 2  # ordered, done: both audited
    c.close()


def test_a_refused_restart_climbs_to_a_reboot(tmp_path):
    c = Cluster(tmp_path)
    c.tick()
    ev = _ordered(c, imex_down())
    assert ev["units"] == ["nvidia-imex"]
    refused = {
        "order": ev["order_id"],
        "ok": False,
        "refused": True,
        "message": "fabric service restart refused: 1 process(es) on GPU 0",
    }
    c.report("node1", imex_down(), fabric_restart=refused)
    c.tick()
    rows = c.ledger("node1")
    assert [(r.rung, r.state) for r in rows][:2] == [
        (Rung.REBOOT, Phase.REBOOTING),
        (Rung.RESTART_FABRIC, Phase.FAILED),
    ]
    c.close()


def test_no_answer_in_time_climbs_to_a_reboot(tmp_path):
    c = Cluster(tmp_path, remediation={"reset_timeout_s": 60})
    c.tick()
    _ordered(c, not_trained())
    c.tick(61)
    assert c.ledger("node1")[0].rung is Rung.REBOOT
    c.close()


# ---- the agent
@pytest.fixture
def agent_cfg(monkeypatch, tmp_path):
    log = tmp_path / "systemctl.log"
    monkeypatch.setenv("STANDIN_SYSTEMCTL_LOG", str(log))
    cfg = parse_config({"checks": {"fabric": {"systemctl": str(STANDIN / "systemctl")}}})
    return cfg, log


def order(*units: str) -> dict:
    return {"check": "fabric.restart", "id": "o-1", "units": list(units)}


def runs_all(cfg, unit):
    return True


def test_the_agent_restarts_fabric_manager_and_checks_it_came_up(agent_cfg, monkeypatch):
    cfg, log = agent_cfg
    monkeypatch.setenv("STANDIN_nvidia_fabricmanager", "active")
    out = fabric_restart.carry_out(cfg, order("nvidia-fabricmanager"), runs_all, lambda: "")
    assert out.ok and out.message == "nvidia-fabricmanager restarted"
    assert log.read_text() == "restart nvidia-fabricmanager\n"
    assert out.metric()["order"] == "o-1"


def test_a_restart_that_leaves_the_service_down_failed(agent_cfg, monkeypatch):
    cfg, _ = agent_cfg
    monkeypatch.setenv("STANDIN_nvidia_fabricmanager", "failed")
    out = fabric_restart.carry_out(cfg, order("nvidia-fabricmanager"), runs_all, lambda: "")
    assert not out.ok and not out.refused and "failed after its restart" in out.message


def test_a_failing_restart_command_failed(agent_cfg, monkeypatch):
    cfg, _ = agent_cfg
    monkeypatch.setenv("STANDIN_RESTART_RC", "1")
    out = fabric_restart.carry_out(cfg, order("nvidia-imex"), runs_all, lambda: "")
    assert not out.ok and "exit 1" in out.message


def test_the_agent_refuses_what_it_cannot_tell_and_restarts_nothing(agent_cfg):
    cfg, log = agent_cfg
    busy = fabric_restart.carry_out(cfg, order("nvidia-imex"), runs_all, lambda: "1 process(es)")
    assert busy.refused and "1 process(es)" in busy.message
    alien = fabric_restart.carry_out(cfg, order("sshd"), runs_all, lambda: "")
    assert alien.refused
    not_here = fabric_restart.carry_out(cfg, order("nvidia-imex"), lambda c, u: False, lambda: "")
    assert not_here.refused and "does not run nvidia-imex" in not_here.message
    assert not log.exists()


def test_a_gpu_nvml_cannot_open_is_not_an_idle_gpu(monkeypatch):
    """A GPU NVML lists but cannot open (lost, fallen off the bus) may still run a job: its
    processes are unknown, so the restart waits (never read as "no process")."""
    from babysitter.checks import nvml

    lost = nvml.LostDevice(1, "GPU is lost", 15)
    monkeypatch.setattr(nvml, "devices", lambda *a, **k: ([], [lost]))
    assert "GPU 1" in fabric_restart._busy()


def test_a_single_node_never_restarts_imex_by_its_profile():
    """The profile decides: a detected GB200 (no configured NVL72 profile) runs no IMEX."""
    cfg = parse_config({"agent": {"hardware_profile": "h100-sxm"}})
    assert fabric_restart._runs(cfg, "nvidia-imex") is False
    assert fabric_restart._runs(cfg, "nvidia-fabricmanager") is True
    nvl = parse_config({"agent": {"hardware_profile": "gb200-nvl72"}})
    assert fabric_restart._runs(nvl, "nvidia-imex") is True
    assert fabric_restart._runs(nvl, "nvidia-fabricmanager") is False


def test_the_driver_asking_to_recover_the_imex_domain_restarts_imex():
    from babysitter.controller.loop.heal.fabric_rung import units_for

    assert units_for("recovery.recover_imex_domain") == ["nvidia-imex"]
    assert units_for("imex.domain_down") == ["nvidia-imex"]
    assert units_for("fabric.not_trained") == ["nvidia-fabricmanager"]


# ---- end to end: a real Slurm devcluster, the controller, an agent per node on fake GPUs
def test_in_a_devcluster_the_agent_restarts_fabric_manager_and_the_node_returns(
    tmp_path, receiver, slurm_daemons
):
    """GPU 2 of node1 (a detected HGX H100) has an untrained fabric: the node is drained naming
    the fabric, the controller orders the Fabric Manager restart through the order path, the
    agent runs (stand-in) `systemctl restart nvidia-fabricmanager`, which trains the fake
    fabric, the validation job passes and the node returns; no reboot."""
    from babysitter.devcluster import fakenvml
    from babysitter.devcluster.sim import SimCluster, sim_validation
    from tests.fixtures.slurm import node_state, wait_for

    base = (tmp_path / "sim").resolve()
    log = tmp_path / "systemctl.log"
    sim = SimCluster(
        base,
        n_nodes=2,
        webhook_url=receiver.url + "/hook",
        reboot_hook=True,
        validation=sim_validation(base),
        policy={"max_drained_fraction": 1.0},
        extra_config={
            "blast_radius": {f"{s}_fraction": 1.0 for s in ("switch", "partition", "cluster")},
            "remediation": {"enabled": True},
        },
        env={
            "BABYSITTER_CHECKS__FABRIC__GRACE_S": "0",
            "BABYSITTER_CHECKS__FABRIC__INTERVAL_S": "1",
            "BABYSITTER_CHECKS__FABRIC__SYSTEMCTL": str(STANDIN / "systemctl"),
            "STANDIN_nvidia_fabricmanager": "active",
            "STANDIN_RESTART_TRAINS": "1",
            "STANDIN_SYSTEMCTL_LOG": str(log),
        },
    )
    sim.up()
    try:
        assert sim.info is not None
        wait_for(
            lambda: [n["verdict"] for n in sim.api("/api/v1/nodes")] == ["healthy", "healthy"],
            90,
            "2 healthy nodes",
        )
        gpus = sim.nodes["node1"].gpus
        for i in range(8):
            gpus.fabric(i, fakenvml.FABRIC_COMPLETED)
        gpus.fabric(2, fakenvml.FABRIC_NOT_STARTED)
        wait_for(lambda: log.exists(), 120, "the agent's Fabric Manager restart")
        assert log.read_text() == "restart nvidia-fabricmanager\n"

        def passed() -> bool:
            rows = sim.api("/api/v1/ledger?node=node1")
            return bool(rows) and rows[0]["state"] == "passed"

        wait_for(passed, 180, "node1's restart_fabric rung passed")
        wait_for(lambda: node_state(sim.info, "node1") == ("idle", "none"), 60, "node1 back")
        (row,) = sim.api("/api/v1/ledger?node=node1")
        assert (row["rung"], row["fault_class"]) == ("restart_fabric", "fabric.not_trained")
        drains = [a for a in sim.api("/api/v1/actions") if a["kind"] == "drain"]
        assert drains and "gpu.fabric" in drains[0]["reason"]
        restarts = [a for a in sim.api("/api/v1/actions") if a["kind"] == "restart_fabric"]
        assert {a["status"] for a in restarts} == {"done"} and len(restarts) == 2
        assert sim.reboots == {}  # the restart healed it: no reboot
        assert node_state(sim.info, "node2") == ("idle", "none")
    finally:
        sim.down()


def _admin_resume(c: Cluster, node: str) -> None:
    """`babysitter resume NODE`: what the API records for the loop."""
    c.store.record_action(
        ActionKind.RESUME, node=node, reason="fixed by hand", rule=Rule.MANUAL, requested_by="admin"
    )


@pytest.mark.parametrize("answer", ["refused", "failed", "none"])
def test_an_admin_resume_mid_restart_ends_the_episode_and_its_late_answer_changes_nothing(
    tmp_path, answer
):
    """An admin returned node1 while its Fabric Manager restart was out: the episode ends
    there. The agent's late refusal / failure / silence used to fail the rung, drain the node
    in Slurm behind the admission step (no drain recorded, no cap counted) and reboot it
    (found by the safety invariants)."""
    c = Cluster(tmp_path, remediation={"reset_timeout_s": 60})
    c.tick()
    ev = _ordered(c, not_trained())
    _admin_resume(c, "node1")
    c.tick()
    assert not c.slurm.node("node1").reason  # back in service
    [row] = c.ledger("node1")
    assert not row.open and "returned to service by an admin" in (row.outcome or "")
    mark = len(c.slurm.calls)
    if answer != "none":
        late = {"order": ev["order_id"], "ok": False, "message": "nvidia-fabricmanager: no"}
        c.report("node1", fabric_restart={**late, "refused": answer == "refused"})
    else:
        c.report("node1")
    for _ in range(3):
        c.tick(61)
    assert c.calls_after(mark, "node1") == []
    assert not c.slurm.node("node1").reason
    assert len(c.ledger("node1")) == 1
    c.close()
