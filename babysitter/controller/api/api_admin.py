"""The admin routes (admin token): each records a pending action the remediation loop
executes, with rule `manual`, and an audit entry saying who asked (the audit entry of its
outcome follows when the loop has executed it)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from babysitter.controller.api.auth import Principal
from babysitter.controller.db import audit
from babysitter.controller.db.actions import ActionKind
from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.report import NODE_NAME


class DrainIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=200)


def admin_router(store: Store, admin: Callable[[Request], Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1")

    def pending(request: Request, kind: ActionKind, **what: Any) -> dict[str, Any]:
        aid = store.record_action(kind, rule=Rule.MANUAL, requested_by="admin", **what)
        node = what.get("node")
        audit.record(
            store,
            audit.AuditEntry(
                kind=kind,
                actor=audit.actor_of("admin", who(request)),
                result=audit.AuditResult.REQUESTED,
                node=node,
                job_id=what.get("job_id"),
                action_id=aid,
                rule=Rule.MANUAL,
                reason=what.get("reason"),
                evidence=audit.evidence(store, [node]).get(node, []) if node else [],
            ),
        )
        return {"action_id": aid, "status": "pending"}

    @router.post("/nodes/{name}/drain", status_code=202)
    def drain(
        request: Request,
        body: DrainIn,
        name: str = Path(pattern=NODE_NAME),
        p: Principal = Depends(admin),
    ) -> dict[str, Any]:
        return pending(request, ActionKind.DRAIN, node=name, reason=body.reason)

    @router.post("/nodes/{name}/resume", status_code=202)
    def resume(
        request: Request, name: str = Path(pattern=NODE_NAME), p: Principal = Depends(admin)
    ) -> dict[str, Any]:
        return pending(request, ActionKind.RESUME, node=name)

    @router.post("/jobs/{job_id}/requeue", status_code=202)
    def requeue(
        request: Request, job_id: int = Path(gt=0, lt=2**53), p: Principal = Depends(admin)
    ) -> dict[str, Any]:
        return pending(request, ActionKind.REQUEUE, job_id=job_id)

    @router.post("/guard/reset", status_code=202)
    def guard_reset(request: Request, p: Principal = Depends(admin)) -> dict[str, Any]:
        return pending(request, ActionKind.GUARD_RESET)

    return router


ACTOR_HEADER = "x-babysitter-actor"  # who is behind the admin token (the CLI sends user@host)
_WHO = re.compile(r"[A-Za-z0-9._@+-]{1,64}")


def who(request: Request) -> str | None:
    """The person an admin request names, if it is a plain user@host word (anything else is
    ignored rather than stored: it is shown to on-call as is)."""
    value = request.headers.get(ACTOR_HEADER, "")
    return value if _WHO.fullmatch(value) else None
