"""RMA evidence (issue 41, deliverable 5): a lemon, or a failed reset / reboot rung, orders an
evidence archive from the node's agent; the agent runs (a stand-in) nvidia-bug-report.sh and
reads the kernel log, bounded; the controller stores one tar.gz with the node's part, its ledger
history and findings, and links it from the alert, the node page and `babysitter nodes NODE`.
The engine is the real one over the in-memory Slurm (tests/fixtures/healing.py); the agent is
the real Agent uploading over real HTTP to the controller's API (uvicorn on a local port)."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from babysitter.agent import rma as agent_rma
from babysitter.agent.daemon import Agent
from babysitter.config import RmaConfig, parse_config
from babysitter.controller.api.orders import OrderBook
from babysitter.controller.db.actions import ActionKind
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.heal import rma
from babysitter.controller.loop.read.ledger import Ledger, Phase
from babysitter.devcluster.receiver import Receiver
from tests.fixtures.controller import Secrets, controller_config, free_port, set_up
from tests.fixtures.healing import Cluster, sdc_mismatch
from tests.fixtures.slurm import wait_for

STANDIN = Path(__file__).parent / "fixtures" / "standin_dcgmi"
BUG_REPORT = str(STANDIN / "nvidia-bug-report.sh")
KERNEL_LINE = "NVRM: Xid (PCI:0000:5d:00): 79, pid=1234, GPU has fallen off the bus."


@contextmanager
def served(app: Any) -> Iterator[str]:
    """The controller's ASGI app on a local port (uvicorn, a thread of this test)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        wait_for(lambda: server.started, 60, "the controller's API listening")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(60)


def _lemon(c: Cluster) -> None:
    """An intermittent SDC mismatch: drained, clean, resumed, again, until node1 is a lemon."""
    c.tick()
    for _ in range(5):
        c.report("node1", sdc_mismatch())
        c.tick()
        c.report("node1")
        c.tick()
        c.tick()


def _agent(secrets: Secrets, tmp_path: Path, url: str, **rma_cfg: Any) -> Agent:
    cfg = parse_config(
        {
            "agent": {
                "node_name": "node1",
                "controller_url": url,
                "token_file": str(secrets.node_token_file("node1")),
                "spool_path": str(tmp_path / "spool.db"),
                "enabled_checks": ["host.resources"],
            },
            "checks": {"host": {"check_slurmd": False, "min_free_gb": 0}},
            "rma": {
                "bug_report_command": [BUG_REPORT],
                "kernel_log_command": ["echo", KERNEL_LINE],
                **rma_cfg,
            },
        }
    )
    return Agent(cfg)


def _orders(book: OrderBook, node: str) -> list[dict[str, Any]]:
    book.refresh()
    part = book.answer_part(node)
    return json.loads(part[len(b',"orders":') :]) if part else []


def _members(blob: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {
            m.name.split("/", 1)[-1]: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def test_a_lemon_leaves_an_archive_reachable_from_alert_node_page_and_cli(
    tmp_path: Path, secrets: Secrets, receiver: Receiver
):
    archive_dir = tmp_path / "rma"
    c = Cluster(
        tmp_path,
        rma={"archive_dir": str(archive_dir)},
        alerts={"webhook_url": receiver.url + "/hook"},
    )
    _lemon(c)
    assert c.slurm.node("node1").reason.startswith("babysitter: lemon:")
    # the lemon ordered the evidence from node1's agent, in the answer to its reports
    (ordered,) = rma.archives(c.store, node="node1")
    assert ordered.state == "ordered" and ordered.trigger.startswith("lemon: 3 drains")
    book = OrderBook(c.store)
    (order,) = [o for o in _orders(book, "node1") if o["check"] == "rma.collect"]
    assert _orders(book, "node2") == []

    cfg = controller_config(
        secrets, f"sqlite:///{tmp_path / 'heal.db'}", rma={"archive_dir": str(archive_dir)}
    )
    with set_up(cfg) as ctl, served(ctl.app()) as url:
        agent = _agent(secrets, tmp_path, url)
        agent.take_orders([order])  # what the shipper does with the answer's orders
        wait_for(
            lambda: rma.archives(c.store, node="node1")[0].state == "collected",
            120,
            "the archive stored",
        )
        c.tick()  # the loop sees it: the alert with its link, the lemon's ledger row names it
        (a,) = rma.archives(c.store, node="node1")
        link = f"/api/v1/rma/{a.id}/archive"
        read = {"Authorization": f"Bearer {secrets.read}"}

        # the archive: the bug report and kernel log from the node, the ledger and findings
        r = httpx.get(url + link, headers=read, timeout=30)
        assert r.status_code == 200, r.text
        got = _members(r.content)
        assert {"manifest.json", "node-evidence.tar.gz", "ledger.json", "findings.json"} <= set(got)
        node_part = _members(got["node-evidence.tar.gz"])
        report = gzip.decompress(node_part["nvidia-bug-report.log.gz"]).decode()
        assert "Start of NVIDIA bug report log file." in report
        assert KERNEL_LINE in node_part["kernel.log"].decode()
        assert json.loads(got["ledger.json"])[0]["state"] == "lemon"
        assert "miscomputed a reference matmul" in got["findings.json"].decode()
        manifest = json.loads(got["manifest.json"])
        assert manifest["bug_report"].startswith("collected")
        assert manifest["kernel_log"] == "1 lines from echo"
        assert httpx.get(url + link, timeout=30).status_code == 403  # a reader's, not anyone's

        # the alert links it
        wait_for(
            lambda: any(
                b.get("condition") == "rma_evidence" and link in b.get("summary", "")
                for b in receiver.bodies("/hook")
            ),
            60,
            "the rma_evidence alert with its link",
        )
        assert Ledger(c.store).history("node1")[0].evidence["rma_archive"] == link
        # the node page links it
        page = httpx.get(f"{url}/ui/nodes/node1", headers=read, timeout=30)
        assert page.status_code == 200 and f'href="{link}"' in page.text
        # `babysitter nodes node1` shows it, as a URL to download
        cli = [sys.executable, "-m", "babysitter.cli.main", "nodes", "node1", "--url", url]
        out = subprocess.run(
            [*cli, "--token", secrets.read],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert "RMA evidence collected" in out.stdout and f"{url}{link}" in out.stdout
        # the collection is an action on the node's record
        (act,) = [x for x in c.store.actions() if x.kind is ActionKind.EVIDENCE]
        assert act.status == "done" and a.path in (act.outcome or "")
    c.close()


def test_a_collection_that_never_arrives_is_a_failure_that_pages(
    tmp_path: Path, receiver: Receiver
):
    """No agent answers (the node is dead): after collect_timeout_s the collection is failed,
    recorded and alerted, never dropped silently."""
    c = Cluster(
        tmp_path,
        rma={"archive_dir": str(tmp_path / "rma"), "collect_timeout_s": 60},
        alerts={"webhook_url": receiver.url + "/hook"},
    )
    c.tick()
    # a reboot rung that failed (the fault still there after the reboot)
    Ledger(c.store).add(
        "node1",
        Rung.REBOOT,
        "xid.79",
        "xid: XID 79",
        Phase.FAILED,
        c.now,
        outcome="fault still there",
    )
    c.tick()
    (a,) = rma.archives(c.store, node="node1")
    assert a.state == "ordered" and a.trigger.startswith("reboot failed: fault still there")
    c.tick(61)
    (a,) = rma.archives(c.store, node="node1")
    assert a.state == "failed" and "sent nothing within 60 s" in (a.outcome or "")
    (act,) = [x for x in c.store.actions() if x.kind is ActionKind.EVIDENCE]
    assert act.status == "failed"
    wait_for(
        lambda: any(
            b.get("condition") == "rma_evidence" and "could not be collected" in b["summary"]
            for b in receiver.bodies("/hook")
        ),
        60,
        "the rma_evidence warning",
    )
    c.close()


def test_the_agent_bounds_the_bug_report_and_says_what_is_missing(tmp_path: Path):
    absent = RmaConfig(bug_report_command=[str(tmp_path / "no-such-bug-report.sh")])
    assert agent_rma.bug_report(absent, tmp_path)[1].startswith("absent:")
    work = tmp_path / "w"
    work.mkdir()
    big = RmaConfig(bug_report_command=[BUG_REPORT], max_mb=1e-6)
    assert agent_rma.bug_report(big, work)[1].startswith("left out:")
    hung = tmp_path / "h"
    hung.mkdir()
    slow = RmaConfig(bug_report_command=["sleep", "3600"], bug_report_timeout_s=1)
    path, why = agent_rma.bug_report(slow, hung)
    assert path is None and "killed after 1 s" in why
    broken = RmaConfig(kernel_log_command=["false"])
    assert agent_rma.kernel_log(broken)[1].startswith("unknown:")
    lines = RmaConfig(kernel_log_command=["seq", "1", "100"], kernel_log_lines=10)
    text, why = agent_rma.kernel_log(lines)
    assert text.decode().split() == [str(i) for i in range(91, 101)] and why.startswith("10 lines")


@pytest.mark.parametrize("who", ["node2", "node1-wrong-order"])
def test_an_upload_is_taken_only_from_its_node_for_its_order(
    tmp_path: Path, secrets: Secrets, who: str
):
    from fastapi.testclient import TestClient

    cfg = controller_config(
        secrets, f"sqlite:///{tmp_path / 'c.db'}", rma={"archive_dir": str(tmp_path / "rma")}
    )
    with set_up(cfg) as ctl:
        Ledger(ctl.store).add("node1", Rung.INSPECT, "x", "x", Phase.LEMON, rma_now())
        rma.RmaEvidence(cfg, ctl.store).step(rma_now(), [], [])
        (a,) = rma.archives(ctl.store, node="node1")
        order = a.order_id if who == "node2" else "0" * 8 + a.order_id[8:]
        node = "node2" if who == "node2" else "node1"
        r = TestClient(ctl.app()).post(
            f"/api/v1/nodes/node1/rma/{order}", content=b"x", headers=secrets.headers(node)
        )
        assert r.status_code == (403 if who == "node2" else 404), r.text
        assert rma.archives(ctl.store, node="node1")[0].state == "ordered"


def rma_now() -> datetime:
    return datetime.now(UTC) - timedelta(seconds=1)


def test_an_archive_the_controller_cannot_write_is_a_failed_collection(
    tmp_path: Path, secrets: Secrets
):
    from fastapi.testclient import TestClient

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the archive directory should be")
    cfg = controller_config(
        secrets, f"sqlite:///{tmp_path / 'c.db'}", rma={"archive_dir": str(blocked)}
    )
    with set_up(cfg) as ctl:
        Ledger(ctl.store).add("node1", Rung.INSPECT, "x", "x", Phase.LEMON, rma_now())
        step = rma.RmaEvidence(cfg, ctl.store)
        step.step(rma_now(), [], [])
        (a,) = rma.archives(ctl.store, node="node1")
        r = TestClient(ctl.app()).post(
            f"/api/v1/nodes/node1/rma/{a.order_id}", content=b"x", headers=secrets.headers("node1")
        )
        assert r.status_code == 507, r.text
        (a,) = rma.archives(ctl.store, node="node1")
        assert a.state == "failed" and "cannot store the archive" in (a.outcome or "")
        firing: list = []
        step.step(rma_now(), firing, [])
        assert [(x.condition, x.severity) for x in firing] == [("rma_evidence", "warning")]


def test_a_reloaded_max_mb_bounds_the_next_upload(tmp_path: Path, secrets: Secrets):
    """rma.max_mb is live: the agents' reload lets bigger bug reports through, so the
    controller's bound on an upload must follow it (else every bigger archive is a 413)."""
    from fastapi.testclient import TestClient

    cfg = controller_config(
        secrets,
        f"sqlite:///{tmp_path / 'c.db'}",
        rma={"archive_dir": str(tmp_path / "rma"), "max_mb": 1},
    )
    with set_up(cfg) as ctl:
        client = TestClient(ctl.app())
        body = b"x" * (3 * 1024 * 1024)
        order = "0" * 8 + "-0000-0000-0000-" + "0" * 12
        url = f"/api/v1/nodes/node1/rma/{order}"
        assert client.post(url, content=body, headers=secrets.headers("node1")).status_code == 413
        cfg.rma.max_mb = 8  # as a reload writes it (babysitter/reload.py)
        r = client.post(url, content=body, headers=secrets.headers("node1"))
        assert r.status_code == 404, r.text  # read whole; no such order


def test_an_archive_id_no_database_can_hold_is_refused_not_a_server_error(
    tmp_path: Path, secrets: Secrets
):
    """schemathesis found it: an id past SQLite's 64-bit integers was a 500."""
    from fastapi.testclient import TestClient

    cfg = controller_config(secrets, f"sqlite:///{tmp_path / 'c.db'}")
    with set_up(cfg) as ctl:
        client = TestClient(ctl.app())
        admin = {"Authorization": f"Bearer {secrets.admin}"}
        huge = client.get(f"/api/v1/rma/{2**127}/archive", headers=admin)
        assert huge.status_code == 422, huge.text
        assert client.get("/api/v1/rma/7/archive", headers=admin).status_code == 404


def _part(members: list[tuple[str, bytes]]) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_node_part_that_decompresses_past_its_bound_is_unreadable_not_read_whole():
    """A node with its own token and an open order cannot make the controller inflate a gzip
    bomb while it looks for the node's manifest (the manifest comes last in the agent's part)."""
    from babysitter.controller.loop.heal.rma_archive import _node_manifest

    manifest = ("node-manifest.json", b'{"bug_report": "absent", "kernel_log": "3 lines"}')
    honest = _part([("kernel.log", b"a\nb\nc\n"), manifest])
    assert _node_manifest(honest)["kernel_log"] == "3 lines"
    bomb = _part([("nvidia-bug-report.log.gz", bytes(8 * 1024 * 1024)), manifest])
    assert len(bomb) < 64 * 1024  # zeros: a few KB that inflate to 8 MB
    assert _node_manifest(bomb, slack=1024 * 1024) == {}
    assert _node_manifest(bomb)["bug_report"] == "absent"  # within the default bound: read


def test_an_archive_past_keep_days_is_deleted_and_its_row_says_so(tmp_path: Path):
    """A year of 50 MB bug reports would fill the controller's disk: after [rma] keep_days the
    file goes, the row stays (when, why, sha256) as `expired`, with no download link."""
    from babysitter.controller.db import models as m
    from babysitter.controller.db.retention import Retention

    archive_dir = tmp_path / "rma"
    archive_dir.mkdir()
    c = Cluster(tmp_path, rma={"archive_dir": str(archive_dir), "keep_days": 30})
    made = datetime(2026, 1, 1, tzinfo=UTC)
    ids = {}
    for name, created in (("old", made), ("new", made + timedelta(days=29))):
        (archive_dir / f"rma-node1-{name}.tar.gz").write_bytes(b"evidence")
        with c.store.engine.begin() as conn:
            ids[name] = conn.execute(
                m.rma_archives.insert().values(
                    node="node1",
                    trigger="lemon: test",
                    order_id=f"order-{name}",
                    state="collected",
                    outcome="bug report collected",
                    path=f"rma-node1-{name}.tar.gz",
                    size=8,
                    sha256="0" * 64,
                    alerted=True,
                    created_at=created,
                    updated_at=created,
                )
            ).inserted_primary_key[0]
    retention = Retention(c.store, c.cfg.controller, rma=c.cfg.rma)
    retention.run_once(now=made + timedelta(days=31))

    old, new = rma.archive(c.store, ids["old"]), rma.archive(c.store, ids["new"])
    assert old is not None and new is not None
    assert not (archive_dir / "rma-node1-old.tar.gz").exists()
    assert old.state == "expired" and old.path is None and old.sha256 == "0" * 64
    assert "keep_days" in (old.outcome or "") and old.to_json()["url"] is None
    assert (archive_dir / "rma-node1-new.tar.gz").exists() and new.state == "collected"
    assert retention.rma_expired == 1
    c.close()
