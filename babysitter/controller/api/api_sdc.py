"""GET /api/v1/sdc (admin or read token): the periodic SDC test's schedule per node: when it
was last tested, with which backend and result, whether it is under test now, and why a due
node is not being tested."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request

from babysitter.controller.api.auth import Principal
from babysitter.controller.db.store import Store
from babysitter.controller.loop.sdc.store import schedule_rows


def sdc_router(store: Store, reader: Callable[[Request], Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1")

    @router.get("/sdc")
    def sdc_schedule(
        node: str | None = None, _: Principal = Depends(reader)
    ) -> list[dict[str, Any]]:
        rows = schedule_rows(store)
        return [r for r in rows if node is None or r["node"] == node]

    return router
