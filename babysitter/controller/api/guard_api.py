"""GET /api/v1/guard: the blast-radius guard's state and why (written by the remediation loop
each time it changes; `babysitter status` shows it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request

from babysitter.controller.api.auth import Principal
from babysitter.controller.db.store import Store
from babysitter.controller.loop.read.guard import guard_view


def guard_router(store: Store, reader: Callable[[Request], Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1")

    @router.get("/guard")
    def get_guard(_: Principal = Depends(reader)) -> dict[str, Any]:
        return guard_view(store)

    return router
