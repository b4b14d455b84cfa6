"""Bounded readers (controller/api/readers.py, metrics_snapshot.py): the status page and
/metrics have a rate per client address and a worker budget of their own, /metrics can take a
token, and a scrape sends the values read from the store once per interval, never reading node
rows itself."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from babysitter.controller.api import cockpit_metrics
from babysitter.controller.api.api_read import node_view
from babysitter.controller.api.readers import Limit, ReaderGate
from babysitter.controller.db.store import now
from babysitter.controller.loop.record.metrics import ControllerMetrics
from babysitter.controller.runtime import Controller
from tests.fixtures.controller import controller_config, set_up
from tests.fixtures.reports import DBE, WARN, wire_report


def test_a_reader_past_its_rate_gets_429_and_reports_still_go_in(secrets, tmp_path):
    cfg = controller_config(
        secrets,
        f"sqlite:///{tmp_path / 'r.db'}",
        controller={"metrics_requests_per_s": 0.001, "metrics_burst": 3},
    )
    with set_up(cfg) as c:
        api = TestClient(c.served_app())
        codes = [api.get("/metrics").status_code for _ in range(5)]
        refused = api.get("/metrics")
        report = api.post(
            "/api/v1/reports", json=wire_report("node1"), headers=secrets.headers("node1")
        )
        health = api.get("/healthz")
    assert codes == [200, 200, 200, 429, 429]
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert report.status_code == 202, report.text
    assert health.status_code == 200


def test_the_rate_is_per_client_and_refills():
    clock = [0.0]

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gate = ReaderGate(
        app, {"ui": Limit(per_s=0.5, burst=2), "metrics": Limit(1, 1)}, 2, 8, lambda: clock[0]
    )

    async def run() -> list[tuple[int, str | None]]:
        out = []
        for path, client, at in [
            ("/ui", "10.0.0.1", 0.0),
            ("/ui/nodes/n1", "10.0.0.1", 0.0),
            ("/ui", "10.0.0.1", 0.0),  # third at once: past the burst
            ("/ui", "10.0.0.2", 0.0),  # another address has its own bucket
            ("/api/v1/nodes", "10.0.0.1", 0.0),  # not a reader: not limited here
            ("/ui", "10.0.0.1", 2.0),  # one token back after 1 / 0.5 s
        ]:
            clock[0] = at
            sent: list[dict] = []

            async def send(m: dict, sent: list[dict] = sent) -> None:
                sent.append(m)

            async def receive() -> dict:
                return {"type": "http.request", "body": b"", "more_body": False}

            scope = {
                "type": "http",
                "method": "GET",
                "path": path,
                "client": (client, 1),
                "headers": [],
            }
            await gate(scope, receive, send)
            headers = dict(sent[0]["headers"])
            retry = headers.get(b"retry-after")
            out.append((sent[0]["status"], None if retry is None else retry.decode()))
        return out

    assert asyncio.run(run()) == [
        (200, None),
        (200, None),
        (429, "2"),
        (200, None),
        (200, None),
        (200, None),
    ]


def test_readers_have_their_own_workers_and_never_hold_the_rest():
    """With every reader worker busy and the queue full, the next reader is refused at once
    while a report (not a reader) goes straight through."""

    async def run() -> dict[str, int]:
        hold = asyncio.Event()

        async def app(scope, receive, send):
            if scope["path"] != "/api/v1/reports":
                await hold.wait()  # a slow page render
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        gate = ReaderGate(app, {"ui": Limit(1000, 1000), "metrics": Limit(1000, 1000)}, 2, 1)

        async def status(path: str, client: str) -> int:
            sent: list[dict] = []

            async def send(m: dict) -> None:
                sent.append(m)

            async def receive() -> dict:
                return {"type": "http.request", "body": b"", "more_body": False}

            scope = {
                "type": "http",
                "method": "GET",
                "path": path,
                "client": (client, 1),
                "headers": [],
            }
            await gate(scope, receive, send)
            return int(sent[0]["status"])

        busy = [asyncio.create_task(status("/ui", f"10.0.1.{i}")) for i in range(3)]
        while gate.waiting < 1:  # two served, one waiting for a worker
            await asyncio.sleep(0)
        refused = await status("/metrics", "10.0.2.1")
        report = await status("/api/v1/reports", "10.0.2.2")
        hold.set()
        served = await asyncio.gather(*busy)
        return {"refused": refused, "report": report, "served": sum(s == 200 for s in served)}

    assert asyncio.run(run()) == {"refused": 429, "report": 200, "served": 3}


def test_metrics_needs_its_token_when_one_is_configured(secrets, tmp_path):
    token = secrets.dir / "metrics.token"
    token.write_text("metrics-token-0123456789")
    token.chmod(0o600)
    cfg = controller_config(
        secrets, f"sqlite:///{tmp_path / 'r.db'}", controller={"metrics_token_file": str(token)}
    )
    with set_up(cfg) as c:
        api = TestClient(c.served_app())
        bare = api.get("/metrics")
        wrong = api.get("/metrics", headers={"Authorization": "Bearer nope"})
        right = api.get("/metrics", headers={"Authorization": "Bearer metrics-token-0123456789"})
        read = api.get("/metrics", headers={"Authorization": f"Bearer {secrets.read}"})
        probes = api.get("/healthz").status_code
    assert bare.status_code == 401
    assert wrong.status_code == 403
    assert right.status_code == 200 and "babysitter_store_up 1.0" in right.text
    assert read.status_code == 200
    assert probes == 200  # the probes stay open


def test_metrics_is_open_without_a_token_configured(ctl):
    assert TestClient(ctl.served_app()).get("/metrics").status_code == 200


def _families(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(fam.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _seed(c: Controller, api: TestClient, secrets) -> None:
    for node in ("n1", "n2", "n3", "n6"):
        api.post("/api/v1/reports", json=wire_report(node), headers=secrets.headers(node))
    api.post("/api/v1/reports", json=wire_report("n4", [DBE]), headers=secrets.headers("n4"))
    api.post("/api/v1/reports", json=wire_report("n5", [WARN]), headers=secrets.headers("n5"))
    two_h = datetime.now(UTC) - timedelta(hours=2)
    c.store.set_node("n6", last_report_at=two_h)  # silent past the heartbeat timeout
    c.store.set_node("n4", babysitter_drained=True, drain_reason="gpu: dbe", drained_at=two_h)
    c.store.set_node(
        "n3", slurm_state="IDLE+DRAIN", slurm_reason="babysitter: [manual] psu", drained_at=two_h
    )
    c.state["leaf_of"] = {"n1": "leaf1", "n2": "leaf1", "n4": "leaf2"}.get


def test_metrics_from_the_snapshot_are_what_a_scrape_read_from_the_store(secrets, tmp_path):
    """The same families and values as /metrics computed straight from the store on the
    scrape (what it did before the snapshot), for a seeded store."""
    with set_up(controller_config(secrets, f"sqlite:///{tmp_path / 'm.db'}")) as c:
        api = TestClient(c.app())
        _seed(c, api, secrets)
        c.store_metrics.refresh()
        got = _families(api.get("/metrics").text)
        # the scrape as it was: every node's verdict and the cockpit gauges, read now
        direct = ControllerMetrics()
        verdicts = {"healthy": 0, "suspect": 0, "unhealthy": 0, "unknown": 0}
        for n in c.store.node_rows():
            v = node_view(n, c.state)["verdict"]
            verdicts[v] += 1
            leaf = c.state["leaf_of"](n["name"])
            if leaf:
                direct.switch_nodes.labels(leaf, v).inc()
        for v, k in verdicts.items():
            direct.nodes.labels(v).set(k)
        cockpit_metrics.refresh(c.store, direct, c.state, now())
        direct.store_up.set(1)
        want = _families(generate_latest(direct.store_registry).decode())
    assert want["babysitter_nodes"][(("verdict", "unhealthy"),)] == 1
    assert want["babysitter_nodes"][(("verdict", "suspect"),)] == 1
    assert want["babysitter_nodes"][(("verdict", "unknown"),)] == 1
    assert want["babysitter_nodes"][(("verdict", "healthy"),)] == 3
    ages = ("babysitter_oldest_drain_age_seconds", "babysitter_node_drained_seconds")
    for name, samples in want.items():
        assert name in got, name
        if name.endswith("_created"):  # when each process made the counter
            continue
        if name in ages:  # read a moment apart: the same series, the same age within a minute
            assert set(got[name]) == set(samples), name
            assert all(abs(got[name][k] - v) < 60 for k, v in samples.items()), name
        else:
            assert got[name] == samples, name


def test_a_scrape_reads_no_node_rows(secrets, tmp_path):
    with set_up(controller_config(secrets, f"sqlite:///{tmp_path / 'm.db'}")) as c:
        api = TestClient(c.app())
        _seed(c, api, secrets)
        c.store_metrics.refresh()
        statements: list[str] = []

        @event.listens_for(c.store.engine, "before_cursor_execute")
        def seen(conn, cursor, statement, params, context, executemany):
            statements.append(statement)

        texts = [api.get("/metrics").text for _ in range(3)]
        event.remove(c.store.engine, "before_cursor_execute", seen)
        # the next read, on the publisher's schedule, does read them
        c.store_metrics.refresh()
    assert not [s for s in statements if "nodes" in s.lower()], statements
    assert all('babysitter_nodes{verdict="unhealthy"} 1.0' in t for t in texts)
