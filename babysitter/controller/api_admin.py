"""The admin routes (admin token): each records a pending action the remediation loop
executes, with rule `manual`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from babysitter.controller.auth import Principal
from babysitter.controller.store import Store
from babysitter.report import NODE_NAME


class DrainIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=200)


def admin_router(store: Store, admin: Callable[[Request], Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1")

    def pending(kind: str, **what: Any) -> dict[str, Any]:
        aid = store.record_action(kind, rule="manual", requested_by="admin", **what)
        return {"action_id": aid, "status": "pending"}

    @router.post("/nodes/{name}/drain", status_code=202)
    def drain(
        body: DrainIn, name: str = Path(pattern=NODE_NAME), p: Principal = Depends(admin)
    ) -> dict[str, Any]:
        return pending("drain", node=name, reason=body.reason)

    @router.post("/nodes/{name}/resume", status_code=202)
    def resume(
        name: str = Path(pattern=NODE_NAME), p: Principal = Depends(admin)
    ) -> dict[str, Any]:
        return pending("resume", node=name)

    @router.post("/jobs/{job_id}/requeue", status_code=202)
    def requeue(
        job_id: int = Path(gt=0, lt=2**53), p: Principal = Depends(admin)
    ) -> dict[str, Any]:
        return pending("requeue", job_id=job_id)

    @router.post("/guard/reset", status_code=202)
    def guard_reset(p: Principal = Depends(admin)) -> dict[str, Any]:
        return pending("guard_reset")

    return router
