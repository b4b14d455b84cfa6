"""Validation before a node returns: the pure policy, and end to end on a real Slurm devcluster
(a MAINT reservation, the validation job through sbatch, resume only after it passes; a
bit flip during validation keeps the node drained and alerts)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from babysitter.controller.loop.decide.node.facts_model import (
    ClusterFacts,
    NodeFacts,
    PolicySettings,
)
from babysitter.controller.loop.decide.node.policy import decide
from babysitter.controller.loop.heal.validation import read_verdict
from babysitter.devcluster.fakenvml import build
from babysitter.devcluster.receiver import Receiver
from babysitter.devcluster.sim import SimCluster
from tests.fixtures.slurm import node_state, slurm, wait_for

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
CLUSTER = ClusterFacts(partition_sizes={"default": 10})


def _cleared(**kw) -> NodeFacts:
    return NodeFacts(
        "n1",
        consecutive_clean=3,
        heartbeat_age_s=1,
        drained=True,
        ours=True,
        reason="babysitter: gpu: XID 79",
        **kw,
    )


def _kinds(n: NodeFacts, s: PolicySettings) -> list[str]:
    return [d.kind for d in decide([n], CLUSTER, s, NOW).decisions if d.node == "n1"]


def test_cleared_node_is_validated_before_resume():
    on = PolicySettings(validate_before_resume=True)
    assert "validate" in _kinds(_cleared(), on) and "resume" not in _kinds(_cleared(), on)
    assert "resume" in _kinds(_cleared(), PolicySettings())  # off: resumes as before


def test_no_second_job_while_one_runs_and_an_admin_after_max_attempts():
    on = PolicySettings(validate_before_resume=True, validation_max_attempts=2)
    running = _kinds(_cleared(validation="running"), on)
    assert "validate" not in running and "resume" not in running
    retry = _kinds(_cleared(validation="failed", validation_failures=1), on)
    assert "validate" in retry
    done = decide([_cleared(validation="failed", validation_failures=2)], CLUSTER, on, NOW)
    kinds = [(d.kind, d.rule) for d in done.decisions if d.node == "n1"]
    assert ("escalate", "validation_exhausted") in kinds
    assert not any(k in ("validate", "resume") for k, _ in kinds)


def test_verdict_is_the_last_json_line_and_no_link_is_followed(tmp_path: Path):
    out = tmp_path / "v.out"
    out.write_text('noise\n{"ok": true}\nmore noise\n{"ok": false, "failures": ["x"]}\n')
    assert read_verdict(out) == {"ok": False, "failures": ["x"]}
    link = tmp_path / "link.out"
    link.symlink_to(out)
    assert read_verdict(link) is None
    assert read_verdict(tmp_path / "missing.out") is None


@pytest.fixture
def sim(tmp_path: Path, receiver: Receiver, slurm_daemons: str) -> Iterator[SimCluster]:
    base = tmp_path / "sim"
    lib = build()
    node_dir = base / "nodes" / "{node}"
    validate = [sys.executable, "-m", "babysitter.cli.main", "validate", "--json"]
    # node3's validation flips a bit in its matmul (an SDC the node's passive checks cannot
    # see); node2's passes.
    # --gpus 0: numpy cannot test the fake GPUs, so these nodes are validated as CPU-only ones
    script = (
        f"extra=; [ {{node}} = node3 ] && extra='--inject 0,3,5,30'; "
        f"exec {shlex.join(validate)} --stress-s 2 --gpus 0 $extra"
    )
    s = SimCluster(
        base,
        n_nodes=4,
        webhook_url=receiver.url + "/hook",
        policy={"validate_before_resume": True},
        validation={
            "command": ["sh", "-c", script],
            "output_dir": str(base / "validation"),
            "time_limit_min": 5,
            "max_attempts": 1,  # so node3 waits for an admin after its one failure
            "sbatch_args": [
                f"--export=ALL,FAKE_NVML_STATE={node_dir}/nvml-state,LD_LIBRARY_PATH={lib},"
                f"BABYSITTER_AGENT__SPOOL_PATH={node_dir}/validate-state/spool.db,"
                # no GPU backend here: the CPU run must be asked for (auto fails closed)
                "BABYSITTER_CHECKS__SDC__BACKEND=numpy"
            ],
        },
    )
    s.up()
    try:
        yield s
    finally:
        s.down()


def _reservations(sim: SimCluster) -> str:
    assert sim.info is not None
    return slurm(sim.info, "scontrol", "show", "reservation").stdout


def test_validation_job_gates_resume(sim: SimCluster, receiver: Receiver):
    assert sim.info is not None
    wait_for(
        lambda: [n["verdict"] for n in sim.api("/api/v1/nodes")].count("healthy") == 4,
        60,
        "4 healthy nodes",
    )
    for node in ("node2", "node3"):
        (sim.base / "nodes" / node / "validate-state").mkdir()
        sim.inject_xid(node, 3, 79)
    for node in ("node2", "node3"):
        wait_for(lambda n=node: node_state(sim.info, n)[0] in ("drain", "drng"), 30, "drained")
        sim.reboot(node)

    def validations() -> list[dict]:
        return [a for a in sim.api("/api/v1/actions") if a["kind"] == "validate"]

    # The job runs on the node, inside babysitter's reservation, before any resume.
    wait_for(lambda: len([a for a in validations() if a["job_id"]]) == 2, 90, "2 jobs")
    assert "babysitter_validate_node2" in _reservations(sim)
    jobs = {a["node"]: a["job_id"] for a in validations()}
    show = slurm(sim.info, "scontrol", "show", "job", str(jobs["node2"])).stdout
    assert "NodeList=node2" in show and "Reservation=babysitter_validate_node2" in show
    # it asked for the node's 8 GPUs (its Slurm gres): a job that asks for none sees none
    assert "gpu:8" in show or "gpu=8" in show, show

    wait_for(
        lambda: (
            {a["node"]: a["status"] for a in validations()} == {"node2": "done", "node3": "failed"}
        ),
        180,
        "both validations finished",
    )
    # node2 passed: back in service, reservation gone; resumed by validation, not before it.
    wait_for(lambda: node_state(sim.info, "node2")[0] == "idle", 30, "node2 idle")
    assert "babysitter_validate_node2" not in _reservations(sim)
    assert not [a for a in sim.api("/api/v1/actions") if a["kind"] == "resume"]
    # node3 failed: drained again with the verdict, and on-call is told.
    state, reason = node_state(sim.info, "node3")
    assert state in ("drain", "drng"), state
    assert reason.startswith("babysitter: validation failed:"), reason
    assert "bit-wise" in reason or "ABFT" in reason or "checksum" in reason, reason
    wait_for(
        lambda: any(
            b.get("node") == "node3"
            and b.get("condition") == "validation_failed"
            and b["state"] == "firing"
            for b in receiver.bodies("/hook")
        ),
        30,
        "validation_failed alert",
    )
    wait_for(
        lambda: any(
            b.get("node") == "node3" and b.get("condition") == "validation_lemon"
            for b in receiver.bodies("/hook")
        ),
        30,
        "lemon alert after max_attempts",
    )
    assert [a["status"] for a in validations() if a["node"] == "node3"] == ["failed"]


# ---- the validation job asks for the node's GPUs and says how many to test (issue 42)


def _argv_for(gres: str, tmp_path: Path) -> list[str]:
    from dataclasses import replace

    from babysitter.config import parse_config
    from babysitter.controller.db.store import Store
    from babysitter.controller.loop.heal.validation import Validator
    from bench.slurm_standin import InMemorySlurm

    slurm_ = InMemorySlurm(["n1"])
    slurm_._nodes["n1"] = replace(slurm_._nodes["n1"], gres=gres)
    cfg = parse_config({"validation": {"output_dir": str(tmp_path)}})
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    store.upgrade()
    return Validator(cfg, store, slurm_)._argv("n1")


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [("gpu:8", 8), ("gpu:h100:8(S:0-1)", 8), ("gpu:a100:4,gpu:v100:2,mps:100", 6)],
)
def test_the_validation_job_asks_for_every_gpu_of_the_node(tmp_path: Path, gres: str, gpus: int):
    argv = _argv_for(gres, tmp_path)
    assert f"--gres=gpu:{gpus}" in argv
    wrapped = shlex.split(argv[argv.index("--wrap") + 1])
    assert wrapped[:2] == ["env", f"BABYSITTER_VALIDATE_GPUS={gpus}"]
    # and the DCGM diag level for what was done (none: a cleared fault, dcgm_other)
    assert wrapped[2:5] == ["BABYSITTER_DCGM_LEVEL=1", "babysitter", "validate"]


def test_a_node_without_gpu_gres_has_an_unknown_gpu_count_not_zero(tmp_path: Path):
    """Whole-node exclusive clusters configure no GPU gres on GPU nodes: passing 0 made
    `babysitter validate` pass such a node on the CPU when NVML failed after a reboot. The
    count is unknown: not passed (and unset), so validate goes by the profile and NVML."""
    for gres in ("", "(null)", "mps:100"):
        argv = _argv_for(gres, tmp_path)
        assert not [a for a in argv if a.startswith("--gres")]
        wrapped = shlex.split(argv[argv.index("--wrap") + 1])
        assert wrapped[:3] == ["env", "-u", "BABYSITTER_VALIDATE_GPUS"]
        assert wrapped[3:6] == ["BABYSITTER_DCGM_LEVEL=1", "babysitter", "validate"]
        assert not [w for w in wrapped if w.startswith("BABYSITTER_VALIDATE_GPUS=")]
