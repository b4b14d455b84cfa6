"""The status page (/ui) in-process: who may see it (read or admin token as a bearer header,
or the login form's cookie), what it shows, and that nothing on it — nor any other non-GET
route — lets a viewer change anything."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from babysitter.controller.api import fleet_query, fleet_view
from babysitter.controller.api.ui.session import COOKIE, Sessions
from babysitter.controller.api.ui.throttle import LoginThrottle
from babysitter.controller.db import audit
from babysitter.controller.db import models as m
from babysitter.controller.runtime import Controller
from tests.fixtures.controller import controller_config
from tests.fixtures.fleet import seed_nodes
from tests.fixtures.reports import DBE, wire_report


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """SQLite only: the pages do not depend on the database (test_api covers both)."""
    return sqlite_url


@pytest.fixture
def api(ctl: Controller) -> TestClient:
    # as a browser reaches it (TLS at the controller or at a proxy): the cookie is Secure
    return TestClient(ctl.app(), base_url="https://testserver", follow_redirects=False)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_browser_without_a_session_is_sent_to_the_login_form(api):
    for path in ("/ui", "/ui/nodes/node1", "/ui/audit"):
        r = api.get(path)
        assert r.status_code == 303 and r.headers["location"] == "/ui/login", path
    assert api.get("/ui", headers=bearer("wrong")).status_code == 401


def test_login_form_sets_a_viewing_cookie(api, secrets, ctl):
    r = api.post("/ui/login", data={"token": "not-a-token"})
    assert r.status_code == 403 and "not a valid" in r.text
    assert COOKIE not in r.cookies
    r = api.post("/ui/login", data={"token": secrets.read})
    assert r.status_code == 303 and r.headers["location"] == "/ui"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and secrets.read not in cookie
    page = api.get("/ui")
    assert page.status_code == 200 and "read view" in page.text
    # a forged or tampered cookie is not a session
    _, expiry, sig = api.cookies[COOKIE].split(".")
    api.cookies.set(COOKIE, f"admin.{expiry}.{sig}", path="/ui")
    assert api.get("/ui").status_code == 303
    # logout is a POST (a link or an image on another page cannot log a viewer out)
    assert api.get("/ui/logout").status_code == 405
    out = api.post("/ui/logout")
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert f"{COOKIE}=" in out.headers["set-cookie"] and "Max-Age=0" in out.headers["set-cookie"]
    # logging in wrote nothing
    assert ctl.store.count("actions") == 0 and audit.entries(ctl.store) == []


def test_sessions_expire_and_die_with_a_token_change(secrets):
    s = Sessions(secrets.secret, secrets.admin, secrets.read)
    cookie = s.issue("read", now=1000.0)
    assert s.role(cookie, now=1001.0) == "read"
    assert s.role(cookie, now=1000.0 + 13 * 3600) is None
    assert Sessions(secrets.secret, "new-admin-token", secrets.read).role(cookie, 1001.0) is None
    assert s.role("read.99999999999.00", now=1001.0) is None
    assert s.role("x" * 1000) is None


def test_fleet_and_node_pages_show_a_fault_and_its_drain_with_evidence(api, secrets, ctl):
    api.post("/api/v1/reports", json=wire_report("node1", [DBE]), headers=secrets.headers("node1"))
    api.post("/api/v1/reports", json=wire_report("node2"), headers=secrets.headers("node2"))
    aid = ctl.store.record_action(
        "drain",
        node="node1",
        reason="babysitter: ecc",
        rule="critical_finding",
        status="done",
        outcome="ok",
    )
    audit.record_actions(ctl.store, [aid])
    ctl.fleet.refresh()  # the loop's tick publishes the page's snapshot
    page = api.get("/ui", headers=bearer(secrets.read))
    assert page.status_code == 200
    assert re.search(r'id="node-node1" data-verdict="unhealthy"', page.text)
    # a healthy node is counted, not shown, unless asked for
    assert 'id="node-node2"' not in page.text and "healthy: <b>1</b>" in page.text
    healthy = api.get("/ui?verdict=healthy", headers=bearer(secrets.read)).text
    assert re.search(r'id="node-node2" data-verdict="healthy"', healthy)
    assert 'id="node-node1"' not in healthy
    assert '<meta http-equiv="refresh" content="5">' in page.text
    assert (
        "<script" not in page.text and "script-src" not in page.headers["content-security-policy"]
    )
    node = api.get("/ui/nodes/node1", headers=bearer(secrets.admin))
    assert node.status_code == 200 and 'data-verdict="unhealthy"' in node.text
    actions = node.text.split('id="actions"', 1)[1].split("</section>", 1)[0]
    assert "drain" in actions and "ecc.dbe.volatile" in actions and "policy" in actions
    log = api.get("/ui/audit", headers=bearer(secrets.read))
    assert log.status_code == 200 and "ecc.dbe.volatile" in log.text.split("<main>", 1)[1]
    assert api.get("/ui/nodes/node9", headers=bearer(secrets.read)).status_code == 404
    assert api.get("/ui/nodes/..%2Fx", headers=bearer(secrets.read)).status_code in (404, 422)


def test_hostile_text_is_escaped(api, secrets):
    report = wire_report("node3", [{**DBE, "message": "<script>alert(1)</script>"}])
    assert (
        api.post("/api/v1/reports", json=report, headers=secrets.headers("node3")).status_code
        == 202
    )
    page = api.get("/ui/nodes/node3", headers=bearer(secrets.read)).text
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page


def api_routes(routes: list) -> Iterator[APIRoute]:
    """Every APIRoute, also inside included routers (FastAPI nests them)."""
    for r in routes:
        if isinstance(r, APIRoute):
            yield r
        inner = getattr(r, "original_router", None)
        if inner is not None:
            yield from api_routes(inner.routes)


def test_the_read_token_cannot_change_anything(ctl, secrets):
    app = ctl.app()
    api = TestClient(app, follow_redirects=False)
    routes = list(api_routes(app.app.routes))
    writers = [(r.path, m) for r in routes for m in r.methods if m not in ("GET", "HEAD")]
    assert len(writers) >= 7  # reports, drain, resume, requeue, guard reset, maintenance x2
    for path, method in writers:
        if path in ("/ui/login", "/ui/logout"):
            continue  # set or drop a viewing cookie; asserted to write nothing above
        url = re.sub(r"\{[^}]+\}", "1", path).replace("/nodes/1/", "/nodes/node1/")
        r = api.request(method, url, headers=bearer(secrets.read), json={})
        assert r.status_code in (401, 403), (method, path, r.status_code)
    assert ctl.store.count("actions") == 0 and audit.entries(ctl.store) == []


def test_a_node_in_two_partitions_is_one_tile_counted_in_each(ctl, secrets):
    slurm_nodes = {
        "node1": SimpleNamespace(partitions=("batch", "gpu")),
        "node2": SimpleNamespace(partitions=("batch",)),
        "node3": SimpleNamespace(partitions=()),
    }
    leaves = {"node1": "leaf1", "node2": "leaf2"}
    ctl.fleet.slurm_nodes = lambda: slurm_nodes
    ctl.fleet.switch_of = leaves.get
    ctl.fleet.domain_of = {"node1": "nvl1", "node2": "nvl1", "node3": "nvl2"}.get
    # the same leaves on /metrics, per verdict (the dashboard's per-switch panels)
    ctl.state["leaf_of"] = leaves.get
    api = TestClient(ctl.app())
    for name, findings in (("node1", [DBE]), ("node2", None), ("node3", None)):
        api.post("/api/v1/reports", json=wire_report(name, findings), headers=secrets.headers(name))
    snap = ctl.fleet.refresh()
    assert snap.by_partition["batch"] == {**ZERO, "unhealthy": 1, "healthy": 1}
    assert snap.by_partition["gpu"] == {**ZERO, "unhealthy": 1}
    assert snap.by_partition["(no Slurm partition known)"] == {**ZERO, "healthy": 1}
    assert snap.by_switch == {"leaf1": {**ZERO, "unhealthy": 1}, "leaf2": {**ZERO, "healthy": 1}}
    assert snap.by_domain == {
        "nvl1": {**ZERO, "unhealthy": 1, "healthy": 1},
        "nvl2": {**ZERO, "healthy": 1},
    }
    for url in ("/ui", "/ui?verdict=all"):
        page = api.get(url, headers=bearer(secrets.read)).text
        assert page.count('id="node-node1"') == 1, url
    page = api.get("/ui", headers=bearer(secrets.read)).text
    table = section(page, "partitions")
    assert 'href="/ui?verdict=unhealthy&amp;partition=gpu"' in table
    assert 'href="/ui?partition=batch"' in table
    assert 'href="/ui?verdict=unhealthy&amp;switch=leaf1"' in section(page, "switches")
    assert 'href="/ui?verdict=unhealthy&amp;domain=nvl1"' in section(page, "domains")
    nvl1 = api.get("/ui?verdict=all&domain=nvl1", headers=bearer(secrets.read)).text
    assert tiles(nvl1) == ["node1", "node2"]
    gpu = api.get("/ui?verdict=all&partition=gpu", headers=bearer(secrets.read)).text
    assert tiles(gpu) == ["node1"]
    batch = api.get("/ui?verdict=all&partition=batch", headers=bearer(secrets.read)).text
    assert tiles(batch) == ["node1", "node2"]
    assert tiles(
        api.get("/ui?verdict=healthy&switch=leaf2", headers=bearer(secrets.read)).text
    ) == ["node2"]
    text = api.get("/metrics").text
    assert 'babysitter_switch_nodes{switch="leaf1",verdict="unhealthy"} 1.0' in text
    assert 'babysitter_switch_nodes{switch="leaf2",verdict="healthy"} 1.0' in text


ZERO = dict.fromkeys(("unhealthy", "suspect", "unknown", "validating", "healthy"), 0)


def section(page: str, sid: str) -> str:
    return page.split(f'id="{sid}"', 1)[1].split("</section>", 1)[0]


def tiles(page: str) -> list[str]:
    return re.findall(r'class="tile[^"]*" id="node-([^"]+)"', page)


def test_counts_lead_the_page_as_links_and_the_needy_nodes_are_paged(ctl, secrets, api):
    """250 unhealthy and 20 suspect among 1,000: the counts first, each a filter; the nodes that
    need a human 100 to a page, worst first; healthy ones counted only."""
    names = [f"gpu{i:04d}" for i in range(1000)]
    seed_nodes(
        ctl.store,
        healthy=names[270:],
        unhealthy=names[:250],
        suspect=names[250:270],
        message="Xid 79: GPU has fallen off the bus " * 40,  # a long alert text
    )
    ctl.fleet.refresh()
    page = api.get("/ui", headers=bearer(secrets.read)).text
    summary = section(page, "summary")
    assert page.index('id="summary"') < page.index('id="nodes"')
    assert 'href="/ui?verdict=unhealthy">unhealthy: <b>250</b>' in summary
    assert 'href="/ui?verdict=suspect">suspect: <b>20</b>' in summary
    assert 'href="/ui?verdict=healthy">healthy: <b>730</b>' in summary
    assert "needs a human: <b>270</b>" in summary
    first = tiles(page)
    assert first == names[:100] and 'id="next" href="/ui?page=2"' in page
    # a long text is cut on the tile (the node's page has it whole)
    assert "Xid 79: GPU has fallen off the bus" in page
    assert "Xid 79: GPU has fallen off the bus " * 5 not in page
    third = api.get("/ui?page=3", headers=bearer(secrets.read)).text
    assert tiles(third) == names[200:270] and 'id="next"' not in third  # suspect after
    assert (
        tiles(api.get("/ui?verdict=suspect", headers=bearer(secrets.read)).text) == names[250:270]
    )
    healthy = api.get("/ui?verdict=healthy&page=8", headers=bearer(secrets.read)).text
    assert tiles(healthy) == names[970:]
    assert len(page.encode()) < 100_000


def test_search_by_name_or_hostlist_and_filter_by_reason_owner(ctl, secrets, api):
    names = [f"gpu{i:03d}" for i in range(1, 41)]
    seed_nodes(ctl.store, healthy=names[4:], unhealthy=names[:4])
    with ctl.store.engine.begin() as c:
        c.execute(
            m.nodes.update()
            .where(m.nodes.c.name.in_(["gpu001", "gpu002"]))
            .values(babysitter_drained=True, drain_reason="babysitter: ecc.dbe.volatile")
        )
        c.execute(
            m.nodes.update()
            .where(m.nodes.c.name == "gpu003")
            .values(slurm_state="IDLE+DRAIN", slurm_reason="cable swap (jdoe)")
        )
    ctl.fleet.refresh()
    read = bearer(secrets.read)
    assert tiles(api.get("/ui?q=gpu[003-005,040]", headers=read).text) == [
        "gpu003",
        "gpu004",
        "gpu005",
        "gpu040",
    ]
    assert tiles(api.get("/ui?q=gpu01", headers=read).text) == [f"gpu01{i}" for i in range(10)]
    assert tiles(api.get("/ui?owner=babysitter", headers=read).text) == ["gpu001", "gpu002"]
    assert tiles(api.get("/ui?owner=admin", headers=read).text) == ["gpu003"]
    assert tiles(api.get("/ui?verdict=drained", headers=read).text) == [
        "gpu001",
        "gpu002",
        "gpu003",
    ]
    bad = api.get("/ui?q=gpu[1-", headers=read)
    assert bad.status_code == 200 and "not a Slurm hostlist" in bad.text and tiles(bad.text) == []
    assert "no such verdict" in api.get("/ui?verdict=bogus", headers=read).text
    # a search cannot make the controller list millions of names
    huge = api.get("/ui?q=a[0-99999]b[0-99999]", headers=read)
    assert "more than 100000 names" in huge.text and tiles(huge.text) == []


def test_an_unchanged_page_is_a_304_and_a_change_is_sent(ctl, secrets, api):
    seed_nodes(ctl.store, healthy=[f"n{i}" for i in range(50)], unhealthy=["bad1"])
    ctl.fleet.refresh()
    read = bearer(secrets.read)
    first = api.get("/ui", headers=read)
    tag = first.headers["etag"]
    assert first.status_code == 200 and "no-store" not in first.headers["cache-control"]
    # a tick with nothing new on the page: the same version (a node reporting its fault again
    # is not news)
    api.post("/api/v1/reports", json=wire_report("bad1", [DBE]), headers=secrets.headers("bad1"))
    ctl.fleet.refresh()
    again = api.get("/ui", headers={**read, "If-None-Match": tag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == tag
    assert "default-src 'none'" in again.headers["content-security-policy"]
    size = len(again.content) + sum(len(k) + len(v) + 4 for k, v in again.headers.items())
    print(f"conditional refresh, nothing changed: {size} bytes of headers and body")
    assert size <= 1024
    # the admin's view is its own page
    assert (
        api.get("/ui", headers={**bearer(secrets.admin), "If-None-Match": tag}).status_code == 200
    )
    api.post("/api/v1/reports", json=wire_report("n7", [DBE]), headers=secrets.headers("n7"))
    ctl.fleet.refresh()
    changed = api.get("/ui", headers={**read, "If-None-Match": tag})
    assert changed.status_code == 200 and changed.headers["etag"] != tag
    assert tiles(changed.text) == ["bad1", "n7"]


def test_a_store_that_cannot_be_read_shows_every_node_unknown_not_healthy(
    ctl, secrets, api, monkeypatch
):
    seed_nodes(ctl.store, healthy=["n1", "n2"], unhealthy=["n3"])
    ctl.fleet.refresh()

    def broken(*args, **kwargs):
        raise OperationalError("SELECT", {}, Exception("database is locked"))

    monkeypatch.setattr(fleet_view, "_read_nodes", broken)
    snap = ctl.fleet.refresh()
    assert snap.error and snap.counts["healthy"] == 0 and snap.counts["unknown"] == 3
    page = api.get("/ui", headers=bearer(secrets.read)).text
    assert "The store could not be read" in page and "healthy: <b>0</b>" in page
    assert tiles(page) == ["n1", "n2", "n3"]
    assert set(re.findall(r'data-verdict="(\w+)" href="/ui/nodes', page)) == {"unknown"}


@pytest.mark.parametrize(
    "until,why",
    [("2000-01-01T00:00:00Z", "until is in the past"), ("2999-01-01T00:00:00Z", "at most 31 days")],
)
def test_a_maintenance_window_that_cannot_be_is_refused_in_the_apis_error_shape(
    api, secrets, until, why
):
    """A window in the past or too long is a 422 in the same shape as every other invalid
    request (the OpenAPI document promises it), naming the field, and opens nothing."""
    r = api.post(
        "/api/v1/maintenance",
        json={"nodes": "node[1-2]", "until": until, "reason": "cable swap"},
        headers=bearer(secrets.admin),
    )
    assert r.status_code == 422
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "until"] and why in err["msg"]
    assert api.get("/api/v1/maintenance?all=true", headers=bearer(secrets.admin)).json() == []


def test_the_page_logs_out_with_a_post_form(api, secrets):
    page = api.get("/ui", headers=bearer(secrets.read)).text
    assert '<form class="logout" method="post" action="/ui/logout">' in page
    assert 'href="/ui/logout"' not in page


@pytest.mark.parametrize(
    ("public_url", "secure"),
    [(None, True), ("https://babysitter.example", True), ("http://10.0.0.5:8090", False)],
)
def test_the_login_cookie_is_secure_unless_the_deployment_is_plain_http(
    secrets, tmp_path, public_url, secure
):
    """Behind a TLS proxy the controller serves plain http itself, yet the cookie must never
    travel in clear: Secure by default, not only when the controller holds the certificate."""
    extra = {"public_url": public_url} if public_url else {}
    ctl = Controller(controller_config(secrets, f"sqlite:///{tmp_path / 'c.db'}", controller=extra))
    ctl.setup()
    try:
        api = TestClient(ctl.app(), follow_redirects=False)
        r = api.post("/ui/login", data={"token": secrets.read})
    finally:
        ctl.close()
    assert r.status_code == 303
    assert ("; secure" in r.headers["set-cookie"].lower()) is secure


def test_wrong_tokens_wait_longer_and_longer():
    now = [1000.0]
    t = LoginThrottle(free=3, clock=lambda: now[0])
    assert [t.failed("10.0.0.9") for _ in range(2)] == [0.0, 0.0]
    assert t.failed("10.0.0.9") == 1.0  # the third wrong token: wait 1 s
    assert t.wait_s("10.0.0.9") == 1.0 and t.wait_s("10.0.0.8") == 0.0  # per address
    now[0] += 1.0
    assert t.failed("10.0.0.9") == 2.0 and t.failed("10.0.0.9") == 4.0  # doubling
    for _ in range(30):
        wait = t.failed("10.0.0.9")
    assert wait == 900.0  # bounded
    t.succeeded("10.0.0.9")
    assert t.wait_s("10.0.0.9") == 0.0


def test_a_script_hammering_the_login_form_stays_locked_out():
    # every try during the wait counts: past ~1,030 of them 2**n was no float (OverflowError,
    # a 500 that dropped the address's count and gave the script its free tries back)
    now = [1000.0]
    t = LoginThrottle(free=5, clock=lambda: now[0])
    for _ in range(5000):
        t.failed("10.0.0.9")
    assert t.wait_s("10.0.0.9") == 900.0


def test_nvlink_domains_come_from_the_loops_membership(ctl, secrets, api):
    """The domains the loop knows (agents' reports, else Slurm's blocks) count and filter."""
    assert ctl.engine is not None
    ctl.engine.domains.membership = {"node1": "uuid-a/1", "node2": "uuid-a/1"}
    for name, findings in (("node1", [DBE]), ("node2", None)):
        api.post("/api/v1/reports", json=wire_report(name, findings), headers=secrets.headers(name))
    snap = ctl.fleet.refresh()
    assert snap.by_domain == {"uuid-a/1": {**ZERO, "unhealthy": 1, "healthy": 1}}
    page = api.get("/ui?verdict=all&domain=uuid-a/1", headers=bearer(secrets.read)).text
    assert tiles(page) == ["node1", "node2"] and 'id="domains"' in page


def test_a_backwards_range_cannot_hide_a_huge_search_from_the_bound(ctl, secrets, api):
    # a backwards range ("[5-3]") counted as -1 names: a later item of the search made the
    # count of an earlier huge one negative, and the huge one was expanded (1e10 names here)
    assert fleet_query.hostlist_size("a[5-3]") >= 1
    huge = "n[1-100000]x[1-100000],y[1-100000]z[1-100000]w[5-3]"
    assert fleet_query.hostlist_size(huge) > fleet_query.MAX_SEARCH_NAMES
    seed_nodes(ctl.store, healthy=["a1"], unhealthy=[])
    ctl.fleet.refresh()
    # a million names before the backwards range: refused by the bound, not expanded
    page = api.get("/ui?q=a[0-99999]b[0-9],c[0-99999]d[0-19]e[5-3]", headers=bearer(secrets.read))
    assert "more than 100000 names" in page.text and tiles(page.text) == []


def test_a_filter_that_matches_nothing_does_not_read_as_every_node_healthy(ctl, secrets, api):
    seed_nodes(ctl.store, healthy=["n1", "n2"], unhealthy=["n3"])
    ctl.fleet.refresh()
    read = bearer(secrets.read)
    # a typo in a switch, or a reason owner that holds no node: nothing matched, not "all good"
    for query in ("switch=no-such-switch", "owner=admin", "partition=nope", "domain=x"):
        page = api.get(f"/ui?{query}", headers=read).text
        assert tiles(page) == [] and "every node is healthy" not in page, query
        assert "No node matches" in page, query
