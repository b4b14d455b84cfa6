"""RMA evidence routes: the node's agent uploads its part of an ordered archive (its own node
token, only for an order of its own: controller/loop/heal/rma.py), and readers (admin or read token)
list a node's archives and download one."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Path, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from babysitter.config import Config
from babysitter.controller.api.auth import Authenticator, Principal
from babysitter.controller.api.ingress import bearer_token
from babysitter.controller.api.ui.session import COOKIE, Sessions
from babysitter.controller.db.store import Store
from babysitter.controller.loop.heal import rma
from babysitter.controller.loop.heal.rma_archive import Refused, path_of, receive
from babysitter.report import NODE_NAME

ORDER = r"^[0-9a-f-]{36}$"
UPLOAD = re.compile(r"^/api/v1/nodes/[A-Za-z0-9][A-Za-z0-9._-]{0,63}/rma/[0-9a-f-]{36}$")
SLACK = 1024 * 1024  # the kernel log and the manifest, beside a bug report of max_mb


def is_upload(method: str, path: str) -> bool:
    """A node's upload: node-token authenticated by its route, not by the admin body guard."""
    return method == "POST" and UPLOAD.match(path) is not None


Dependency = Callable[[Request], Principal]


def rma_router(
    store: Store, cfg: Config, auth: Authenticator
) -> Callable[[Dependency, Dependency], APIRouter]:
    base = cfg.controller.public_url
    may_read = _may_read(auth)

    def make(reader: Dependency, admin: Dependency) -> APIRouter:
        router = APIRouter(prefix="/api/v1")
        _upload_route(router, store, cfg, auth, base)
        _reader_routes(router, store, cfg, base, reader, may_read)
        return router

    return make


def _may_read(auth: Authenticator) -> Callable[[Request], bool]:
    """Whether a request may download an archive: a reader token, or the status page's login
    cookie (the page links the archive)."""
    sessions = Sessions(auth.secret, auth.admin_token, auth.read_token)

    def may_read(request: Request) -> bool:
        token = bearer_token(request.headers.get("authorization", ""))
        if token is not None:
            p = auth.identify(token)
            return p is not None and p.role in ("admin", "read")
        return sessions.role(request.cookies.get(COOKIE)) is not None

    return may_read


def _upload_route(
    router: APIRouter, store: Store, cfg: Config, auth: Authenticator, base: str | None
) -> None:
    @router.post("/nodes/{name}/rma/{order}", status_code=201)
    async def upload(
        request: Request,
        name: str = Path(pattern=NODE_NAME),
        order: str = Path(pattern=ORDER),
    ) -> dict[str, Any]:
        """The node's part of an RMA evidence archive (tar.gz, agent/rma.py)."""
        token = bearer_token(request.headers.get("authorization", ""))
        p = auth.identify(token, claimed_node=name) if token else None
        if p is None or p.role != "node" or p.node != name:
            raise HTTPException(403, f"the node token of {name} required")
        limit = int(cfg.rma.max_mb * 1024 * 1024) + SLACK  # live: a reload may move it
        length = request.headers.get("content-length", "")
        if length and (not length.isdigit() or int(length) > limit):
            raise HTTPException(413, f"body larger than {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"body larger than {limit} bytes")
            chunks.append(chunk)
        now = datetime.now(UTC)
        try:
            a = await run_in_threadpool(receive, store, cfg, name, order, b"".join(chunks), now)
        except Refused as exc:
            raise HTTPException(exc.status, str(exc)) from None
        return a.to_json(base)


def _reader_routes(
    router: APIRouter,
    store: Store,
    cfg: Config,
    base: str | None,
    reader: Dependency,
    may_read: Callable[[Request], bool],
) -> None:
    @router.get("/nodes/{name}/rma")
    def list_archives(
        name: str = Path(pattern=NODE_NAME), _: Principal = Depends(reader)
    ) -> list[dict[str, Any]]:
        """The node's RMA evidence archives, newest first (ordered, collected, failed,
        expired)."""
        return [a.to_json(base) for a in rma.archives(store, node=name)]

    @router.get("/rma/{archive_id}/archive")
    def download(
        request: Request,
        # a row id: beyond SQL's 64-bit integers is no archive (not a database error)
        archive_id: int = Path(ge=1, le=2**63 - 1),
    ) -> FileResponse:
        """The archive (reader token, or the status page's login cookie: its link)."""
        if not may_read(request):
            raise HTTPException(403, "admin or read token required")
        a = rma.archive(store, archive_id)
        p = path_of(cfg, a) if a else None
        if a is None or p is None:
            raise HTTPException(404, f"no stored RMA evidence archive {archive_id}")
        return FileResponse(p, media_type="application/gzip", filename=a.path)
