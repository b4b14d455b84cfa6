"""The status page's routes: GET pages for a viewer (the read token or the admin token, as a
bearer header like the API, or the cookie the login form sets), and the login form itself.
Nothing here writes to the store or to Slurm: the page has no buttons but "log out" (which
only drops the cookie), only links."""

from __future__ import annotations

import hashlib
import math
import time
from datetime import datetime
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FunctionLoader, select_autoescape
from starlette.requests import ClientDisconnect

from babysitter.controller.api import fleet_query as fq
from babysitter.controller.api import fleet_snapshot as fs
from babysitter.controller.api import fleet_view as fv
from babysitter.controller.api.auth import Authenticator
from babysitter.controller.api.ingress import bearer_token
from babysitter.controller.api.ui import views
from babysitter.controller.api.ui.session import COOKIE, LIFETIME_S, Sessions
from babysitter.controller.api.ui.throttle import LoginThrottle
from babysitter.controller.db import audit
from babysitter.controller.db.store import Store
from babysitter.report import NODE_NAME

LOGIN_PATH = "/ui/login"
LOGOUT_PATH = "/ui/logout"
MAX_LOGIN_BODY = 4096
TEMPLATES = files("babysitter.controller.api.ui") / "templates"


def _template(name: str) -> str | None:
    # only names written in this module reach here; a missing one is a bug, shown as such
    path = TEMPLATES / name
    return path.read_text(encoding="utf-8") if path.is_file() else None


def environment() -> Environment:
    env = Environment(
        loader=FunctionLoader(_template),
        # node names, finding messages and reasons come from nodes and users: always escaped
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["ago"] = _ago
    env.filters["when"] = _when
    return env


def _when(at: datetime | str | None) -> str:
    if at is None:
        return ""
    if isinstance(at, str):
        return at
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def ui_router(
    store: Store,
    auth: Authenticator,
    sessions: Sessions,
    runtime_state: dict[str, Any],
    fleet: fv.FleetView,
    refresh_s: float,
    secure_cookie: bool,
    throttle: LoginThrottle | None = None,
) -> APIRouter:
    router = APIRouter(prefix="/ui", include_in_schema=False)
    env = environment()
    _add_page_routes(router, store, runtime_state, fleet, _Viewer(auth, sessions, env, refresh_s))
    _add_login_routes(router, env, auth, sessions, secure_cookie, throttle or LoginThrottle(5))
    return router


class _Viewer:
    """Who looks at a page (a bearer token or the login cookie), and a page rendered for them
    or the way to the login form."""

    def __init__(
        self, auth: Authenticator, sessions: Sessions, env: Environment, refresh_s: float
    ) -> None:
        self.auth, self.sessions, self.env, self.refresh_s = auth, sessions, env, refresh_s

    def role(self, request: Request) -> str | None:
        """The viewer's role, from a bearer token or the login cookie; None: not logged in."""
        token = bearer_token(request.headers.get("authorization", ""))
        if token is not None:
            p = self.auth.identify(token)
            return p.role if p is not None and p.role in ("admin", "read") else None
        return self.sessions.role(request.cookies.get(COOKIE))

    @staticmethod
    def login_first(request: Request) -> Response:
        # a script with a wrong token gets a 401; a browser goes to the login form
        if request.headers.get("authorization"):
            return HTMLResponse("token not valid for the status page", status_code=401)
        return RedirectResponse(LOGIN_PATH, status_code=303)

    def page(self, request: Request, template: str, status: int = 200, **ctx: Any) -> Response:
        role = self.role(request)
        if role is None:
            return self.login_first(request)
        html = self.env.get_template(template).render(
            role=role, refresh_s=self.refresh_s, path=request.url.path, **ctx
        )
        return HTMLResponse(html, status_code=status, headers=_headers())


def _add_page_routes(
    router: APIRouter,
    store: Store,
    runtime_state: dict[str, Any],
    fleet: fv.FleetView,
    v: _Viewer,
) -> None:
    @router.get("", response_class=HTMLResponse)
    def fleet_page(request: Request) -> Response:
        """The fleet from the published snapshot (fleet_view.py): never a store read. A
        refresh with nothing changed is a 304 (ETag: the snapshot's version, the viewer's role
        and whether the snapshot is stale)."""
        role = v.role(request)
        if role is None:
            return v.login_first(request)
        return _fleet(v.env, fleet, request, role, v.refresh_s)

    @router.get("/nodes/{name}", response_class=HTMLResponse)
    def node_page(request: Request, name: str = Path(pattern=NODE_NAME)) -> Response:
        if v.role(request) is None:
            return v.page(request, "fleet.html")  # the login redirect, before any lookup
        data = views.node_page(store, runtime_state, name)
        if data is None:
            return v.page(request, "missing.html", status=404, name=name)
        return v.page(request, "node.html", p=data)

    @router.get("/audit", response_class=HTMLResponse)
    def audit_page(request: Request, node: str | None = None) -> Response:
        rows = audit.entries(store, node=node, limit=500) if v.role(request) else []
        return v.page(request, "audit.html", entries=rows, node=node)


def _add_login_routes(
    router: APIRouter,
    env: Environment,
    auth: Authenticator,
    sessions: Sessions,
    secure_cookie: bool,
    throttle: LoginThrottle,
) -> None:
    """The login form, its check of a typed token (throttled per client address after a few
    wrong ones: throttle.py), and logout (a POST: a link or an image elsewhere cannot log a
    viewer out)."""

    @router.get("/login", response_class=HTMLResponse)
    def login_form(request: Request) -> Response:
        return _login(env, None)

    @router.post("/login", response_class=HTMLResponse)
    async def login(request: Request) -> Response:
        """Check a token typed into the form; a valid admin or read token gets a viewing
        cookie. Writes nothing but the cookie."""
        client = request.client.host if request.client else ""
        if throttle.wait_s(client) > 0:
            # a try during the wait is not checked, and counts as one more wrong token
            return _too_many(env, throttle.failed(client))
        try:
            body = await request.body()
        except ClientDisconnect:  # cut off past MAX_LOGIN_BODY (api.AdminBodyGuard)
            return _login(env, "request too large", 413)
        if len(body) > MAX_LOGIN_BODY:
            return _login(env, "request too large", 413)
        token = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        p = auth.identify(token) if token else None
        if p is None or p.role not in ("admin", "read"):
            throttle.failed(client)  # the wait, if any, is for the next try
            return _login(env, "not a valid read or admin token", 403)
        throttle.succeeded(client)
        resp = RedirectResponse("/ui", status_code=303)
        resp.set_cookie(
            COOKIE,
            sessions.issue(p.role),
            max_age=LIFETIME_S,
            httponly=True,
            samesite="strict",
            secure=secure_cookie,
            path="/ui",
        )
        return resp

    @router.post("/logout")
    def logout() -> Response:
        resp = RedirectResponse(LOGIN_PATH, status_code=303)
        resp.delete_cookie(COOKIE, path="/ui")
        return resp


def _headers() -> dict[str, str]:
    # no scripts at all on these pages: the browser refuses any that got in
    return {
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
        "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def _fleet(
    env: Environment, fleet: fv.FleetView, request: Request, role: str, refresh_s: float
) -> Response:
    snap = fleet.current
    stale = time.monotonic() - snap.built_at > max(fleet.stale_after_s, 6 * refresh_s)
    tag = _etag(snap, role, stale, str(request.url.query))
    headers = {**_headers(), "Cache-Control": "no-cache, private", "ETag": tag}
    if tag in _tags(request.headers.get("if-none-match", "")):
        return Response(status_code=304, headers=headers)
    query = _query(request)
    items = fq.select_nodes(snap, query)
    pages = max(1, math.ceil(len(items) / fq.PAGE_SIZE))
    query.page = min(query.page, pages)
    first = (query.page - 1) * fq.PAGE_SIZE
    html = env.get_template("fleet.html").render(
        role=role,
        refresh_s=refresh_s,
        path=request.url.path,
        snap=snap,
        stale=stale,
        q=query,
        nodes=fq.rows(snap, items[first : first + fq.PAGE_SIZE]),
        matched=len(items),
        pages=pages,
        first=first,
        link=_linker(query),
        top=_top,
        verdicts=fs.VERDICTS,
        owners=fs.OWNERS,
    )
    return HTMLResponse(html, headers=headers)


def _etag(snap: fs.FleetSnapshot, role: str, stale: bool, query: str) -> str:
    digest = hashlib.sha1(query.encode(), usedforsecurity=False).hexdigest()[:8]
    return f'W/"{snap.instance}-{snap.version}-{role}-{int(stale)}-{digest}"'


def _tags(header: str) -> set[str]:
    return {t.strip() for t in header.split(",") if t.strip()}


FILTERS = ("verdict", "partition", "switch", "domain", "owner", "q")


def _query(request: Request) -> fq.Query:
    p = request.query_params
    given = {k: (p.get(k) or "").strip()[:1024] for k in FILTERS}
    query = fq.Query(
        verdict=given["verdict"],
        partition=given["partition"],
        switch=given["switch"],
        domain=given["domain"],
        owner=given["owner"],
        q=given["q"],
    )
    if query.verdict and query.verdict not in (*fs.VERDICTS, "drained", "all"):
        query.errors.append(f"no such verdict: {query.verdict!r}")
        query.verdict = ""
    if query.owner and query.owner not in fs.OWNERS:
        query.errors.append(f"no such reason owner: {query.owner!r}")
        query.owner = ""
    try:
        query.page = max(1, int(p.get("page") or 1))
    except ValueError:
        query.page = 1
    return query


def _linker(query: fq.Query) -> Any:
    """link(**filters): the fleet page's URL with these filters changed (and the first page;
    `keep=False`: only these filters)."""

    def link(keep: bool = True, **changes: Any) -> str:
        params = {k: getattr(query, k) for k in FILTERS} if keep else {}
        params.update(changes)
        clean = {k: v for k, v in params.items() if v not in ("", None, 1)}
        return "/ui" + ("?" + urlencode(clean) if clean else "")

    return link


def _top(groups: dict[str, dict[str, int]], limit: int) -> list[tuple[str, dict[str, int]]]:
    """The groups with nodes needing a human, the most first, at most `limit`."""
    bad = [(g, c) for g, c in groups.items() if sum(c.values()) - c.get("healthy", 0) > 0]
    bad.sort(key=lambda gc: (-(sum(gc[1].values()) - gc[1].get("healthy", 0)), gc[0]))
    return bad[:limit]


def _login(
    env: Environment, error: str | None, status: int = 200, extra: dict[str, str] | None = None
) -> Response:
    html = env.get_template("login.html").render(error=error)
    return HTMLResponse(html, status_code=status, headers={**_headers(), **(extra or {})})


def _too_many(env: Environment, wait_s: float) -> Response:
    retry = str(max(1, math.ceil(wait_s)))
    return _login(
        env, f"too many wrong tokens: try again in {retry} s", 429, {"Retry-After": retry}
    )
