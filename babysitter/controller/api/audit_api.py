"""GET /api/v1/audit: the audit log (admin or read token), newest first."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from babysitter.controller.api.auth import Principal
from babysitter.controller.db import audit
from babysitter.controller.db.store import Store
from babysitter.report import NODE_NAME


def audit_router(store: Store, reader: Callable[[Request], Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1")

    @router.get("/audit")
    def get_audit(
        node: str | None = Query(None, pattern=NODE_NAME),
        since: datetime | None = None,
        limit: int = Query(1000, ge=1, le=10_000),
        _: Principal = Depends(reader),
    ) -> list[dict[str, Any]]:
        return [e.to_json_dict() for e in audit.entries(store, node=node, since=since, limit=limit)]

    return router
