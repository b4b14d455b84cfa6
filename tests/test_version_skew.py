"""A rolling upgrade across releases (docs/deploy.md, "Supported version skew and upgrade
order"): the previous release (tests/data/previous_release.txt, built by
tests/fixtures/releases.py) and this checkout run as real processes over real HTTP, on a real
Slurm devcluster with simulated GPUs.

1. The previous controller with a mixed fleet: two agents of this release, two of the previous.
   A fault on a current agent's node is drained, and the node resumed, by the old controller.
2. The controller is upgraded first, as docs/deploy.md says: the old one stops, the current one
   starts on the same database and migrates it to its head; the agents keep running (their
   reports meanwhile wait in their spools, then are replayed to the new controller).
3. A fault on a previous-release agent's node is drained and resumed by the current controller.

Throughout: no report refused by either controller (the agents' logs and spool counters), every
injected fault drained, every recovery resumed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

import babysitter
from babysitter.agent.spool import Spool
from babysitter.controller.db.migrations import alembic_config
from babysitter.devcluster.sim import SimCluster
from tests.fixtures.releases import PreviousReleaseMissing, installed_version, previous_release
from tests.fixtures.slurm import node_state, wait_for

CURRENT_AGENTS = ("node1", "node2")
PREVIOUS_AGENTS = ("node3", "node4")


@pytest.fixture(scope="module")
def previous() -> Path:
    """The previous release's interpreter. A clone without its commit fails the test (CI
    checks out the whole history of main): a skipped skew test would hide a broken upgrade."""
    try:
        return previous_release()
    except PreviousReleaseMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture
def mixed(tmp_path: Path, previous: Path, slurm_daemons: str) -> Iterator[SimCluster]:
    old = str(previous)
    sim = SimCluster(
        tmp_path / "sim",
        n_nodes=4,
        python={"controller": old, **dict.fromkeys(PREVIOUS_AGENTS, old)},
    )
    sim.up()
    try:
        yield sim
    finally:
        sim.down()


def _revision(sim: SimCluster) -> str:
    engine = create_engine(f"sqlite:///{sim.base / 'babysitter.db'}")
    try:
        with engine.connect() as c:
            return str(c.execute(text("SELECT version_num FROM alembic_version")).scalar_one())
    finally:
        engine.dispose()


def _head() -> str:
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory.from_config(alembic_config()).get_current_head())


def _all_healthy(sim: SimCluster) -> bool:
    nodes = sim.api("/api/v1/nodes")
    return len(nodes) == 4 and all(n["verdict"] == "healthy" for n in nodes)


def _fault_drained_and_resumed(sim: SimCluster, node: str) -> None:
    """An XID 79 (GPU fallen off the bus) on `node`: drained by babysitter; after a simulated
    reboot (the node's agent starts again, of the same release) it is resumed."""
    assert sim.info is not None
    sim.inject_xid(node, 3, 79)
    wait_for(lambda: node_state(sim.info, node)[0] in ("drain", "drng"), 90, f"{node} drained")
    assert node_state(sim.info, node)[1].startswith("babysitter: ")
    sim.reboot(node)
    wait_for(lambda: node_state(sim.info, node)[0] == "idle", 180, f"{node} resumed")


def test_previous_and_current_release_over_a_controller_upgrade(mixed: SimCluster, previous):
    sim = mixed
    assert sim.info is not None
    prev_version, prev_path = installed_version(previous, sim.base)
    assert prev_version != babysitter.__version__ and "site-packages" in prev_path
    wait_for(lambda: _all_healthy(sim), 120, "4 healthy nodes under the previous controller")
    before = _revision(sim)

    # 1. previous controller, a current agent's node faults
    _fault_drained_and_resumed(sim, "node1")

    # 2. the controller upgraded first: the current release on the same database, migrated
    del sim.python["controller"]
    sim.restart_controller()
    assert _revision(sim) == _head()
    print(f"schema {before} -> {_revision(sim)} under a running fleet")  # figures, not asserts
    wait_for(lambda: _all_healthy(sim), 120, "4 healthy nodes under the current controller")

    # 3. current controller, a previous agent's node faults
    _fault_drained_and_resumed(sim, "node3")
    assert all(node_state(sim.info, n)[0] == "idle" for n in ("node1", "node2", "node4"))
    drains = [a for a in sim.api("/api/v1/actions") if a["kind"] == "drain"]
    assert {a["node"] for a in drains} == {"node1", "node3"}

    # no report refused: each agent counts the reports a controller answered with a 4xx (it
    # drops them) in its spool and logs the first of each status
    for node in sim.nodes:
        sim.stop_agent(node)  # their spools closed
    for node in (*CURRENT_AGENTS, *PREVIOUS_AGENTS):
        d = sim.base / "nodes" / node
        log = (d / "agent.log").read_text()
        assert " refused (" not in log, f"{node}: {log[-2000:]}"
        assert Spool(d / "spool.db").counter("refused") == 0, node
