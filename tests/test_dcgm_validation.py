"""DCGM diagnostics in validation (issue 41, deliverable 4): where `dcgmi` is installed the
validation job runs `dcgmi diag -r N -j` at the level the fault asks for, and its per-test
results decide with the matmul; no dcgmi: the matmul alone, said so; an unreadable result or a
hang fails closed. The stand-in dcgmi (tests/fixtures/standin_dcgmi/dcgmi) prints DCGM's own
JSON shapes (3.x and 4.x, from NVIDIA/DCGM's dcgmi/Diag.cpp); the validation job is the real
`babysitter validate` process, started by the controller's Validator, and on a Slurm devcluster
the validation job under sbatch."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from babysitter.checks.dcgm import diag
from babysitter.config import ValidationConfig, parse_config
from babysitter.controller.db.actions import ActionKind
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.diag_level import level_for
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.heal.validation import Validator
from babysitter.controller.loop.read.ledger import Ledger, Phase
from babysitter.devcluster.fakenvml import build
from babysitter.devcluster.receiver import Receiver
from babysitter.devcluster.sim import SimCluster
from bench.slurm_standin import InMemorySlurm
from tests.fixtures.slurm import node_state, wait_for

STANDIN = Path(__file__).parent / "fixtures" / "standin_dcgmi"
DCGMI = str(STANDIN / "dcgmi")
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
DCGM3_PASS = "dcgm3-issue139-pcie-pass"  # real bytes: tests/data/world/dcgm
DCGM4_FAIL = "dcgm4-issue215-diagnostic-fail"


def _run_standin(mode: str, level: int = 2, timeout_s: float = 60) -> diag.DiagResult:
    os.environ["FAKE_DCGMI"] = mode
    try:
        return diag.diagnose(DCGMI, level, timeout_s)
    finally:
        del os.environ["FAKE_DCGMI"]


# ---- the parser, over the stand-in's DCGM output


@pytest.mark.parametrize("shape", ["", "v3:"])
def test_a_passing_diag_passes_with_every_test_recorded(shape: str):
    res = _run_standin(shape + "pass", level=3)
    assert res.ok and res.failures == []
    names = {t.name: t.status for t in res.tests}
    assert names["memory"] == "pass" and names["targeted_stress"] == "pass"
    assert res.version in ("4.2.3", "3.3.9")


@pytest.mark.parametrize("shape", ["", "v3:"])
def test_a_failing_test_fails_and_is_named_with_its_gpu(shape: str):
    res = _run_standin(shape + "fail:memory")
    assert not res.ok
    assert res.failures[0].startswith("dcgmi diag -r 2: memory failed (GPU 0: ")
    assert {t.name: t.status for t in res.tests}["pcie"] == "pass"


def test_a_warning_passes_and_is_kept_with_the_test():
    res = _run_standin("warn:pcie")
    assert res.ok
    pcie = next(t for t in res.tests if t.name == "pcie")
    assert pcie.status == "warn" and "GPU 0" in pcie.messages[0]


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("garbage", "dcgmi printed no JSON"),
        ("runtime_error", "did not run: Unable to connect to the host engine"),
        ("skip_all", "no test ran"),
    ],
)
def test_no_readable_verdict_fails_closed(mode: str, why: str):
    res = _run_standin(mode)
    assert not res.ok and why in res.failures[0], res.failures


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        '{"DCGM Diagnostic": {}}',
        '{"DCGM Diagnostic": {"test_categories": []}}',
        '{"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": [{"name": "m"}]}]}}',
        '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "m", "results": '
        '[{"status": "Excellent"}]}]}]}}',
        '[{"DCGM Diagnostic": 1}]',
    ],
)
def test_an_unknown_shape_is_never_a_pass(text: str):
    res = diag.judge(2, text, 0, 60)
    assert not res.ok and res.failures


def test_a_hung_dcgmi_is_killed_at_its_timeout_and_fails():
    res = _run_standin("hang", timeout_s=1)
    assert not res.ok and "no result within 1 s (killed)" in res.failures[0]


# ---- DCGM versions, and a DCGM that cannot run the diag, named (tests/data/world/dcgm)


def test_dcgm_3x_json_is_read_not_failed_for_its_top_level_name():
    res = _run_standin("corpus:dcgm3-issue139-memory-fail")
    assert res.shape == "2.x/3.x" and not res.ok
    assert res.failures == ["dcgmi diag -r 2: GPU Memory failed"]


def test_a_down_host_engine_is_named_as_the_cause():
    res = _run_standin("corpus:hostengine-down-dcgm-issue57")
    assert not res.ok
    assert res.failures == [
        "dcgmi diag -r 2: DCGM host engine (nv-hostengine) not running: Error: unable to "
        "establish a connection to the specified host: localhost"
    ]


def test_a_lost_host_engine_in_a_runtime_error_is_named():
    # the shape of Diag.cpp RunDiagOnce + HelperDisplayFailureMessage (v3.3.9)
    why = (
        "Error: Unable to complete diagnostic for group 0. Return: (-21) : "
        "Host engine connection invalid/disconnected\n"
    )
    text = json.dumps({"DCGM GPU Diagnostic": {"runtime_error": why, "version": "3.3.9"}})
    res = diag.judge(1, text, 235, 60)
    assert not res.ok and res.version == "3.3.9"
    assert res.failures[0].startswith("dcgmi diag -r 1: DCGM host engine (nv-hostengine) not ")


def test_dcgmi_not_installed_is_named():
    res = diag.diagnose("/nonexistent/dcgmi", 2, 60)
    assert res.failures == ["dcgmi diag -r 2: dcgmi not installed: /nonexistent/dcgmi"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        # DCGM 1.x still printed "DCGM GPU Diagnostic" with a version (nvvs/JsonOutput.cpp)
        (
            '{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": '
            '[{"name": "Blacklist", "results": [{"status": "Pass"}]}]}]}, "version": "1.7.2"}',
            "DCGM too old: DCGM 1.7.2",
        ),
        # dcgmi newer than nv-hostengine: DCGM_ST_VER_MISMATCH in the runtime_error
        (
            '{"DCGM Diagnostic": {"runtime_error": "Error: Unable to complete diagnostic. '
            'Return: (-12) : API version mismatch\\n", "version": "4.2.3"}}',
            "DCGM too old or mismatched: dcgmi and nv-hostengine are of different DCGM versions",
        ),
    ],
)
def test_a_dcgm_too_old_is_named(text: str, why: str):
    res = diag.judge(2, text, 0, 60)
    assert not res.ok and res.failures[0].startswith(f"dcgmi diag -r 2: {why}"), res.failures


def test_2x_connection_error_before_an_embedded_run_still_reads_the_json():
    # 2.x Command.cpp prints this, then StartDiag runs the diag in an embedded host engine
    doc = (STANDIN.parents[1] / "data/world/dcgm/dcgm3-issue139-pcie-pass.json").read_text()
    text = "Error: unable to establish a connection to the specified host: localhost\n" + doc
    res = diag.judge(3, text, 0, 60)
    assert res.ok and {t.name: t.status for t in res.tests}["PCIe"] == "pass"


def test_a_4x_test_printed_by_name_alone_did_not_run():
    # Diag.cpp HelperJsonBuildOutput (4.x) leaves out NOT_RUN results and summaries
    text = json.dumps(
        {
            "DCGM Diagnostic": {
                "test_categories": [
                    {
                        "category": "Hardware",
                        "tests": [
                            {"name": "memory", "results": [{"entity_id": 0, "status": "Pass"}]},
                            {"name": "pulse_test"},
                        ],
                    }
                ]
            }
        }
    )
    res = diag.judge(3, text, 0, 60)
    assert res.ok and {t.name: t.status for t in res.tests} == {
        "memory": "pass",
        "pulse_test": "skip",
    }


# ---- which level


def test_the_level_follows_the_rung_and_the_fault():
    c = ValidationConfig()
    assert level_for(c, "reset_gpu", "xid.79") == 2
    assert level_for(c, "reboot", "xid.79") == 3
    assert level_for(c, None, None) == 1
    assert level_for(c, "reset_gpu", "ecc.dbe.volatile") == 3  # a memory fault: at least 3
    assert level_for(c, None, "xid.48") == 3
    off = ValidationConfig(dcgm_after_reset=0, dcgm_memory_fault=0)
    assert level_for(off, "reset_gpu", "xid.79") == 0


# ---- end to end: the controller's Validator runs the real `babysitter validate` job


class JobSlurm(InMemorySlurm):
    """Slurm's part of a validation: the job's --wrap command runs as a process, its output in
    the --output file, as sbatch would on the node (the rest is the in-memory stand-in)."""

    def __init__(self, node: str, env: dict[str, str]) -> None:
        super().__init__([node])
        self.env = env
        self.outcomes: dict[int, tuple[str, str]] = {}

    def start_validation(self, node, reservation, user, minutes, sbatch_args):
        job = 100 + len(self.outcomes)
        out = next(a for a in sbatch_args if a.startswith("--output=")).split("=", 1)[1]
        wrap = sbatch_args[sbatch_args.index("--wrap") + 1]
        with open(out.replace("%j", str(job)), "w") as f:
            r = subprocess.run(
                ["sh", "-c", wrap], stdout=f, stderr=subprocess.DEVNULL, env=self.env, timeout=300
            )
        self.outcomes[job] = ("COMPLETED" if r.returncode == 0 else "FAILED", f"{r.returncode}:0")
        return job

    def validation_outcome(self, job_id):
        return self.outcomes[job_id]

    def end_validation(self, reservation):
        pass


def _validate(tmp_path: Path, mode: str | None, rung: Rung, fault: str):
    """A node drained for `fault`, healed by `rung`, validated: (its Slurm node, the validate
    action, the stand-in's calls)."""
    env = dict(os.environ)
    env.pop("BABYSITTER_CONFIG", None)
    calls = tmp_path / "dcgmi.calls"
    env.update(
        BABYSITTER_AGENT__SPOOL_PATH=str(tmp_path / "spool.db"),
        BABYSITTER_CHECKS__SDC__BACKEND="numpy",
        BABYSITTER_CHECKS__SDC__SIZE="64",
        BABYSITTER_AGENT__KMSG_PATH=str(tmp_path / "kmsg"),
        FAKE_DCGMI_LOG=str(calls),
    )
    if mode is None:  # no DCGM on this node
        env["BABYSITTER_VALIDATION__DCGMI"] = str(tmp_path / "no-such-dcgmi")
    else:
        env.update(BABYSITTER_VALIDATION__DCGMI=DCGMI, FAKE_DCGMI=mode)
    slurm = JobSlurm("n1", env)
    slurm.drain("n1", f"gpu: {fault}")
    job = [sys.executable, "-m", "babysitter.cli.main", "validate", "--json"]
    cfg = parse_config(
        {
            "policy": {"validate_before_resume": True},
            "validation": {
                "output_dir": str(tmp_path / "validation"),
                # the node is CPU-only here: its GPUs are DCGM's (the stand-in's) alone
                "command": [*job, "--gpus", "0", "--stress-s", "0"],
            },
        }
    )
    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    store.upgrade()
    Ledger(store).add("n1", rung, fault, f"gpu: {fault}", Phase.RESETTING, NOW)
    v = Validator(cfg, store, slurm)
    v.start("n1", f"after {rung.value}: {fault}", NOW)
    firing: list = []
    v.poll(NOW, firing, [])
    action = next(a for a in store.actions() if a.kind is ActionKind.VALIDATE)
    levels = calls.read_text().splitlines() if calls.exists() else []
    return slurm.node("n1"), action, levels, firing


def test_a_failing_diag_keeps_the_node_drained_with_the_test_named(tmp_path: Path):
    node, action, calls, firing = _validate(tmp_path, "fail:memory", Rung.REBOOT, "xid.79")
    assert calls == ["diag -r 3 -j"]  # after a reboot: level 3
    assert action.status == "failed"
    assert "DRAIN" in node.flags
    assert "validation failed: dcgmi diag -r 3: memory failed (GPU 0:" in node.reason
    # the per-test results are recorded with the validation
    assert "[dcgmi diag -r 3: software pass, pcie pass, memory fail," in action.outcome
    assert any(a.condition == "validation_failed" and "memory" in a.summary for a in firing)


def test_a_passing_diag_returns_the_node_and_records_each_test(tmp_path: Path):
    _, action, calls, _ = _validate(tmp_path, "pass", Rung.RESET_GPU, "xid.79")
    assert calls == ["diag -r 2 -j"]  # after a GPU reset: level 2
    assert action.status == "done"
    assert "dcgmi diag -r 2 + matmul [dcgmi diag -r 2: software pass, pcie pass" in (
        action.outcome or ""
    )


def test_without_dcgmi_the_matmul_validates_and_says_so(tmp_path: Path):
    _, action, calls, _ = _validate(tmp_path, None, Rung.REBOOT, "xid.79")
    assert calls == []
    assert action.status == "done" and "matmul (no DCGM)" in (action.outcome or "")


def test_a_real_dcgm_3x_healthy_document_returns_the_node(tmp_path: Path):
    _, action, calls, _ = _validate(tmp_path, f"corpus:{DCGM3_PASS}", Rung.RESET_GPU, "xid.79")
    assert calls == ["diag -r 2 -j"]
    # passed: the Validator returns the node (the drain is lifted by the resume path)
    assert action.status == "done" and (action.outcome or "").startswith("passed")
    assert "[dcgmi diag -r 2: PCIe pass, GPU Memory skip," in (action.outcome or "")


def test_a_real_dcgm_4x_failing_document_names_the_failed_test(tmp_path: Path):
    node, action, _, firing = _validate(tmp_path, f"corpus:{DCGM4_FAIL}", Rung.REBOOT, "xid.79")
    assert action.status == "failed" and "DRAIN" in node.flags
    assert "validation failed: dcgmi diag -r 3: diagnostic failed" in node.reason
    assert "[dcgmi diag -r 3: diagnostic fail]" in (action.outcome or "")
    assert any(a.condition == "validation_failed" and "diagnostic" in a.summary for a in firing)


def test_a_down_host_engine_is_named_in_the_validation_record(tmp_path: Path):
    node, action, _, _ = _validate(
        tmp_path, "corpus:hostengine-down-dcgm-issue57", Rung.RESET_GPU, "xid.79"
    )
    assert action.status == "failed" and "DRAIN" in node.flags
    assert "dcgmi diag -r 2: DCGM host engine (nv-hostengine) not running" in node.reason
    assert "DCGM host engine (nv-hostengine) not running" in (action.outcome or "")


def test_garbage_from_dcgmi_fails_closed(tmp_path: Path):
    node, action, _, _ = _validate(tmp_path, "garbage", Rung.RESET_GPU, "ecc.dbe.volatile")
    assert action.status == "failed" and "DRAIN" in node.flags
    assert "dcgmi diag -r 3: dcgmi printed no JSON" in node.reason  # memory fault: level 3


def test_the_job_tells_validate_the_level(tmp_path: Path):
    slurm = JobSlurm("n1", {})
    cfg = parse_config({"validation": {"output_dir": str(tmp_path)}})
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    store.upgrade()
    Ledger(store).add("n1", Rung.REBOOT, "row_remap.pending", "x", Phase.REBOOTING, NOW)
    argv = Validator(cfg, store, slurm)._argv("n1")
    assert "BABYSITTER_DCGM_LEVEL=3" in shlex.split(argv[argv.index("--wrap") + 1])


# ---- on a real Slurm devcluster: the validation job finds the stand-in dcgmi on its PATH


@pytest.fixture
def sim(tmp_path: Path, receiver: Receiver, slurm_daemons: str) -> Iterator[SimCluster]:
    base = tmp_path / "sim"
    lib = build()
    node_dir = base / "nodes" / "{node}"
    validate = [sys.executable, "-m", "babysitter.cli.main", "validate", "--json"]
    # DCGM is installed on every node (the stand-in on PATH), printing the real bytes of the
    # corpus (tests/data/world/dcgm): node2 a DCGM 3.x document whose tests pass (its top-level
    # object 'DCGM GPU Diagnostic' failed every 3.x validation before), node3 a DCGM 4.x one
    # whose 'diagnostic' test failed. --gpus 0: numpy cannot test the fake GPUs (as in
    # tests/test_validation.py)
    script = (
        f"export PATH={STANDIN}:$PATH; case {{node}} in "
        f"node2) export FAKE_DCGMI=corpus:{DCGM3_PASS};; "
        f"node3) export FAKE_DCGMI=corpus:{DCGM4_FAIL};; esac; "
        f"exec {shlex.join(validate)} --stress-s 1 --gpus 0"
    )
    s = SimCluster(
        base,
        n_nodes=3,
        webhook_url=receiver.url + "/hook",
        # both nodes out at once: which agent reports first is a race, and the node whose
        # validation fails stays out, so a cap of one would hold the other's drain for good
        policy={"validate_before_resume": True, "max_drained_fraction": 1.0},
        extra_config={"blast_radius": {"partition_fraction": 1.0, "cluster_fraction": 1.0}},
        validation={
            "command": ["sh", "-c", script],
            "output_dir": str(base / "validation"),
            "time_limit_min": 5,
            "sbatch_args": [
                f"--export=ALL,FAKE_NVML_STATE={node_dir}/nvml-state,LD_LIBRARY_PATH={lib},"
                f"BABYSITTER_AGENT__SPOOL_PATH={node_dir}/validate-state/spool.db,"
                "BABYSITTER_CHECKS__SDC__BACKEND=numpy"
            ],
        },
    )
    s.up()
    try:
        yield s
    finally:
        s.down()


def test_a_failing_dcgm_diag_keeps_the_node_drained_in_slurm(sim: SimCluster):
    assert sim.info is not None
    wait_for(
        lambda: [n["verdict"] for n in sim.api("/api/v1/nodes")].count("healthy") == 3,
        120,
        "3 healthy nodes",
    )
    for node in ("node2", "node3"):
        (sim.base / "nodes" / node / "validate-state").mkdir()
        sim.inject_xid(node, 3, 79)
    for node in ("node2", "node3"):
        wait_for(lambda n=node: node_state(sim.info, n)[0] in ("drain", "drng"), 60, "drained")
        sim.reboot(node)

    def outcomes() -> dict[str, tuple[str, str]]:
        acts = [a for a in sim.api("/api/v1/actions") if a["kind"] == "validate"]
        return {a["node"]: (a["status"], a["outcome"] or "") for a in acts}

    wait_for(
        lambda: {n: s for n, (s, _) in outcomes().items()} == {"node2": "done", "node3": "failed"},
        300,
        "both validations finished",
    )
    # node2: the real DCGM 3.x document (level 1: a cleared fault) and the matmul passed, each
    # test recorded, and the node is back in service
    assert "dcgmi diag -r 1 + matmul [dcgmi diag -r 1: PCIe pass" in outcomes()["node2"][1]
    wait_for(lambda: node_state(sim.info, "node2")[0] == "idle", 60, "node2 idle")
    # node3: the real DCGM 4.x failure: drained again, the failing test named in Slurm's reason
    state, reason = node_state(sim.info, "node3")
    assert state in ("drain", "drng"), state
    assert reason.startswith("babysitter: validation failed: dcgmi diag -r 1: diagnostic failed")
