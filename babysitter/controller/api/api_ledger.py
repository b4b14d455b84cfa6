"""The lemon ledger over HTTP: read it (admin or read token), clear a node (admin; recorded in
the ledger and the actions log). docs/self-healing.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from babysitter.controller.api.api_admin import who
from babysitter.controller.api.auth import Principal
from babysitter.controller.db import audit
from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.db.store import Store, now
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.read.ledger import Ledger
from babysitter.report import NODE_NAME


class ClearIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=200)


def ledger_router(
    store: Store,
    reader: Callable[[Request], Principal],
    admin: Callable[[Request], Principal],
) -> APIRouter:
    router = APIRouter(prefix="/api/v1")
    ledger = Ledger(store)

    @router.get("/ledger")
    def list_ledger(
        node: str | None = Query(None, pattern=NODE_NAME),
        limit: int = Query(200, ge=1, le=5000),
        open_only: bool = Query(False, alias="open"),
        _: Principal = Depends(reader),
    ) -> list[dict[str, Any]]:
        """Remediations, newest first: rung, state, fault, GPU, evidence. `open=true`: only
        the episodes in progress or holding a node (rebooting, validating, inspect, lemon)."""
        if open_only:
            rows = sorted(ledger.open_rows(), key=lambda r: r.id, reverse=True)
            return [r.to_json() for r in rows if node is None or r.node == node][:limit]
        return [r.to_json() for r in ledger.history(node, limit)]

    @router.post("/nodes/{name}/ledger/clear")
    def clear(
        request: Request,
        body: ClearIn | None = None,
        name: str = Path(pattern=NODE_NAME),
        p: Principal = Depends(admin),
    ) -> dict[str, Any]:
        """The way back for a lemon: its remediations stop counting and its episode closes
        (the node stays drained until `resume`)."""
        why = (body.reason if body else "") or "ledger cleared by an admin"
        person = who(request)
        n = ledger.clear(name, f"admin ({person})" if person else "admin", now(), why)
        aid = store.record_action(
            ActionKind.LEDGER_CLEAR,
            node=name,
            reason=why,
            rule=Rule.MANUAL,
            requested_by="admin",
            status=ActionStatus.DONE,
            outcome=f"cleared {n} remediation(s)",
        )
        audit.record_actions(store, [aid])
        return {"action_id": aid, "cleared": n}

    return router
