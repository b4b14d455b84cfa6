"""Maintenance windows over the API: GET /api/v1/maintenance (admin or read token), POST
/api/v1/maintenance (open one) and POST /api/v1/maintenance/end (close early), admin only."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from babysitter.controller.api.api_admin import who
from babysitter.controller.api.auth import Principal
from babysitter.controller.db.audit import actor_of
from babysitter.controller.loop.admit.maintenance import Maintenance, windows
from babysitter.slurm.hostlist import expand

MAX_NODES = 10_000
MAX_WINDOW = timedelta(days=31)
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def nodes_of(hostlist: str) -> list[str]:
    """A Slurm hostlist as node names; ValueError for anything that is not one."""
    names = expand(hostlist)
    if not names:
        raise ValueError("no nodes")
    if len(names) > MAX_NODES:
        raise ValueError(f"more than {MAX_NODES} nodes")
    bad = [n for n in names if not _NODE.match(n)]
    if bad:
        raise ValueError(f"not a node name: {bad[0][:64]!r}")
    return sorted(set(names))


class StartIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: str = Field(min_length=1, max_length=4096, description="Slurm hostlist")
    until: datetime = Field(description="when the window ends (with a time zone)")
    reason: str = Field(min_length=1, max_length=200)

    @field_validator("nodes")
    @classmethod
    def _hostlist(cls, v: str) -> str:
        nodes_of(v)
        return v

    @field_validator("until")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        if v.tzinfo is None:
            raise ValueError("until needs a time zone (e.g. 2026-11-26T05:00:00Z)")
        # checked here, not in the route: a 422 keeps the API's one validation-error shape
        left = v - datetime.now(UTC)
        if left <= timedelta(0):
            raise ValueError("until is in the past")
        if left > MAX_WINDOW:
            raise ValueError(f"a window lasts at most {MAX_WINDOW.days} days")
        return v.astimezone(UTC)


class EndIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: str = Field(min_length=1, max_length=4096, description="Slurm hostlist")

    @field_validator("nodes")
    @classmethod
    def _hostlist(cls, v: str) -> str:
        nodes_of(v)
        return v


def maintenance_router(
    service: Maintenance,
    reader: Callable[[Request], Principal],
    admin: Callable[[Request], Principal],
) -> APIRouter:
    router = APIRouter(prefix="/api/v1")

    @router.get("/maintenance")
    def list_windows(all: bool = False, _: Principal = Depends(reader)) -> list[dict[str, Any]]:
        return [w.to_json_dict() for w in windows(service.store, active_only=not all)]

    @router.post("/maintenance", status_code=201)
    def start(request: Request, body: StartIn, _: Principal = Depends(admin)) -> dict[str, Any]:
        w = service.start(
            nodes_of(body.nodes),
            body.nodes,
            body.until,
            body.reason,
            actor_of("admin", who(request)),
        )
        return w.to_json_dict()

    @router.post("/maintenance/end")
    def end(request: Request, body: EndIn, _: Principal = Depends(admin)) -> list[dict[str, Any]]:
        closed = service.end(nodes_of(body.nodes), actor_of("admin", who(request)))
        if not closed:
            raise HTTPException(404, f"no open maintenance window covers {body.nodes}")
        return [w.to_json_dict() for w in closed]

    return router
