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

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

import babysitter
from babysitter.agent.shipper import Shipper
from babysitter.agent.spool import Spool
from babysitter.controller.db.migrations import alembic_config
from babysitter.devcluster.sim import SimCluster
from babysitter.wire import HEADER, WIRE_VERSION
from tests.fixtures.releases import (
    PreviousReleaseMissing,
    fit,
    installed_version,
    known_keys,
    previous_release,
)
from tests.fixtures.reports import DBE, wire_report
from tests.fixtures.slurm import node_state, wait_for

CURRENT_AGENTS = ("node1", "node2")
PREVIOUS_AGENTS = ("node3", "node4")


# ---- the wire version and unknown fields (in-process)


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    return sqlite_url  # nothing here depends on the database


def test_a_newer_agents_unknown_fields_are_ignored_not_refused(client, secrets):
    finding = {**DBE, "confidence": 0.97}  # a finding field this controller does not know
    body = wire_report("node1", [finding], wire_version=WIRE_VERSION + 1, trace={"span": "ab"})
    headers = {**secrets.headers("node1"), HEADER: str(WIRE_VERSION + 1)}
    r = client.post("/api/v1/reports", json=body, headers=headers)
    assert r.status_code == 202, r.text
    assert r.headers[HEADER] == str(WIRE_VERSION)  # the agent learns the controller's version
    admin = {"Authorization": f"Bearer {secrets.admin}"}
    node = client.get("/api/v1/nodes/node1", headers=admin).json()
    assert [f["code"] for f in node["open_findings"]] == ["ecc.dbe.volatile"]
    assert "confidence" not in node["open_findings"][0]


def test_a_previous_release_agents_report_is_accepted(client, secrets):
    """babysitter 0.1 sends no wire header and no wire_version."""
    r = client.post("/api/v1/reports", json=wire_report("node1"), headers=secrets.headers("node1"))
    assert r.status_code == 202, r.text


def test_a_wrong_value_is_still_refused(client, secrets):
    body = wire_report("node1", [{**DBE, "severity": "dire", "confidence": 1}])
    r = client.post("/api/v1/reports", json=body, headers=secrets.headers("node1"))
    assert r.status_code == 422


def _refused(metrics_page: str) -> dict[str, float]:
    """babysitter_reports_refused_total by status, from a /metrics page."""
    out: dict[str, float] = {}
    for line in metrics_page.splitlines():
        if line.startswith("babysitter_reports_refused_total{"):
            status = line.split('status="', 1)[1].split('"', 1)[0]
            out[status] = float(line.rsplit(" ", 1)[1])
    return out


def test_the_controller_counts_the_reports_it_refuses_by_status(client, secrets):
    bad = wire_report("node1", [{**DBE, "severity": "dire"}])
    r = client.post("/api/v1/reports", json=bad, headers=secrets.headers("node1"))
    assert r.status_code == 422
    other = client.post("/api/v1/reports", json=wire_report("node2"), headers=secrets.headers("x"))
    assert other.status_code == 403
    good = wire_report("node1")
    assert client.post("/api/v1/reports", json=good, headers=secrets.headers("node1")).is_success
    assert _refused(client.get("/metrics").text) == {"422": 1, "403": 1}


def _shipper(
    tmp_path: Path, answer: httpx.Response, seen: list[httpx.Request], taken: list[dict[str, Any]]
) -> Shipper:
    """A shipper whose controller answers `answer` (requests into `seen`, orders into `taken`)."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer

    s = Shipper("http://controller", "t", Spool(tmp_path / "spool.db"), on_orders=taken.extend)
    s.http = httpx.Client(transport=httpx.MockTransport(handle), headers=s.http.headers)
    return s


@pytest.mark.parametrize(("answered", "learned"), [(None, 1), ("1", 1), ("2", 2), ("9", 9)])
def test_the_agent_says_its_version_and_learns_the_controllers(tmp_path, answered, learned):
    seen: list[httpx.Request] = []
    headers = {HEADER: answered} if answered else {}
    orders = [{"check": "gpu.reset", "id": "o1", "uuid": "GPU-1", "since": "a newer field"}]
    answer = httpx.Response(202, headers=headers, json={"stored": True, "orders": orders})
    taken: list[dict[str, Any]] = []
    s = _shipper(tmp_path, answer, seen, taken)
    report = wire_report("node1")
    assert s._post(report)
    assert seen[0].headers[HEADER] == str(WIRE_VERSION)
    # the body is what babysitter 0.1 takes: no key it does not know (it refuses those)
    assert set(json.loads(seen[0].content)) == set(report)
    assert s.controller_wire == learned
    assert taken == orders  # a newer controller's order keys reach the agent (it reads by name)


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
    # a process of the previous release gets the config it knows: keys new in this release
    # would stop it (unknown keys are refused), as they would on a site rolling back
    known = known_keys(previous, tmp_path)

    def adapt(role: str, config: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        if role not in sim.python:
            return config
        kept, dropped = fit(config, known)
        if dropped:
            print(f"{role} (previous release): left out {', '.join(dropped)}")
        return kept

    sim.adapt_config = adapt
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


def _agent_metrics(sim: SimCluster) -> dict[str, dict[str, Any]]:
    """Each node's metrics of its latest report, as the controller stored them."""
    engine = create_engine(f"sqlite:///{sim.base / 'babysitter.db'}")
    try:
        with engine.connect() as c:
            rows = c.execute(text("SELECT name, metrics FROM nodes")).all()
    finally:
        engine.dispose()
    return {n: (json.loads(m) if isinstance(m, str) else m) or {} for n, m in rows}


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
    # each side is the release it should be: this release's agents say their version and have
    # learned the previous controller's wire version (1: no header); 0.1 agents say neither
    seen = _agent_metrics(sim)
    for n in CURRENT_AGENTS:
        assert seen[n].get("agent_version") == babysitter.__version__, seen[n]
        assert seen[n].get("controller_wire") == 1, seen[n]
    for n in PREVIOUS_AGENTS:
        assert "agent_version" not in seen[n], seen[n]

    # 2. the controller upgraded first: the current release on the same database, migrated
    del sim.python["controller"]
    sim.restart_controller()
    assert _revision(sim) == _head()
    print(f"schema {before} -> {_revision(sim)} under a running fleet")  # figures, not asserts
    wait_for(lambda: _all_healthy(sim), 120, "4 healthy nodes under the current controller")

    # 3. current controller, a previous agent's node faults
    _fault_drained_and_resumed(sim, "node3")
    assert all(node_state(sim.info, n)[0] == "idle" for n in ("node1", "node2", "node4"))
    wait_for(
        lambda: all(_agent_metrics(sim)[n].get("controller_wire") == 2 for n in CURRENT_AGENTS),
        60,
        "this release's agents learned the current controller's wire version",
    )
    drains = [a for a in sim.api("/api/v1/actions") if a["kind"] == "drain"]
    assert {a["node"] for a in drains} == {"node1", "node3"}

    # no report refused: the current controller counted no error answer since its start ...
    pages: list[str] = []  # a 429 (the readers' rate limit) is asked again, never read as 0

    def metrics_page() -> bool:
        r = httpx.get(sim.url + "/metrics", timeout=10)
        pages.extend([r.text] if r.status_code == 200 else [])
        return bool(pages)

    wait_for(metrics_page, 30, "the controller's /metrics page")
    assert "babysitter_reports_refused_total" in pages[0]
    assert not _refused(pages[0])
    # ... and each agent counts the reports a controller answered with a 4xx (it
    # drops them) in its spool and logs the first of each status
    for node in sim.nodes:
        sim.stop_agent(node)  # their spools closed
    for node in (*CURRENT_AGENTS, *PREVIOUS_AGENTS):
        d = sim.base / "nodes" / node
        log = (d / "agent.log").read_text()
        assert " refused (" not in log, f"{node}: {log[-2000:]}"
        assert Spool(d / "spool.db").counter("refused") == 0, node


def test_a_cached_previous_release_whose_borrowed_packages_are_gone_is_built_again(tmp_path):
    """CI runs each try in a fresh clone and keeps /tmp: a previous release cached by another
    checkout must not point at that checkout's venv once it is gone."""
    python = previous_release(tmp_path)
    (pth,) = python.parents[1].glob("lib/python3*/site-packages/zz_babysitter_deps.pth")
    pth.write_text(f"{tmp_path / 'a-removed-checkout' / '.venv'}\n")  # what a gone clone leaves
    again = previous_release(tmp_path)
    assert installed_version(again, tmp_path)[0] == "0.1.0"
    assert "controller_url" in known_keys(again, tmp_path)["agent"]  # its config imports
