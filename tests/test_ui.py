"""The status page (/ui) in-process: who may see it (read or admin token as a bearer header,
or the login form's cookie), what it shows, and that nothing on it — nor any other non-GET
route — lets a viewer change anything."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from babysitter.controller.api.ui.session import COOKIE, Sessions
from babysitter.controller.api.ui.throttle import LoginThrottle
from babysitter.controller.db import audit
from babysitter.controller.runtime import Controller
from tests.fixtures.controller import controller_config
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
    page = api.get("/ui", headers=bearer(secrets.read))
    assert page.status_code == 200
    assert re.search(r'id="node-node1" data-verdict="unhealthy"', page.text)
    assert re.search(r'id="node-node2" data-verdict="healthy"', page.text)
    assert '<meta http-equiv="refresh" content="5">' in page.text
    assert (
        "<script" not in page.text and "script-src" not in page.headers["content-security-policy"]
    )
    node = api.get("/ui/nodes/node1", headers=bearer(secrets.admin))
    assert node.status_code == 200 and 'data-verdict="unhealthy"' in node.text
    actions = node.text.split('id="actions"', 1)[1].split("</section>", 1)[0]
    assert "drain" in actions and "ecc.dbe.volatile" in actions and "policy" in actions
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


def test_fleet_is_grouped_by_partition_and_leaf_switch(ctl, secrets):
    from types import SimpleNamespace

    from babysitter.controller.api.ui.routes import layout_of

    slurm_nodes = {
        "node1": SimpleNamespace(partitions=("batch",)),
        "node2": SimpleNamespace(partitions=("batch",)),
        "node3": SimpleNamespace(partitions=()),
    }
    leaves = {"node1": "leaf1", "node2": "leaf2"}
    layout = layout_of(lambda: slurm_nodes, leaves.get)
    assert layout() == {
        "node1": ("batch · switch leaf1",),
        "node2": ("batch · switch leaf2",),
        "node3": ("(no Slurm partition known)",),
    }
    # the same leaves on /metrics, per verdict (the dashboard's per-switch panels)
    ctl.state["leaf_of"] = leaves.get
    api = TestClient(ctl.app())
    api.post("/api/v1/reports", json=wire_report("node1", [DBE]), headers=secrets.headers("node1"))
    api.post("/api/v1/reports", json=wire_report("node2"), headers=secrets.headers("node2"))
    text = api.get("/metrics").text
    assert 'babysitter_switch_nodes{switch="leaf1",verdict="unhealthy"} 1.0' in text
    assert 'babysitter_switch_nodes{switch="leaf2",verdict="healthy"} 1.0' in text


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
