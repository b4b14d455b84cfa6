"""GET /api/v1/guard: the blast-radius guard's state and why (written by the remediation loop
each time it changes; `babysitter status` shows it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request

from babysitter.controller.auth import Principal
from babysitter.controller.policy import rule_description
from babysitter.controller.store import Store

GUARD_KEY = "guard_tripped"
GUARD_INFO_KEY = "guard"
BLAST_KEY = "blast_radius"  # scoped caps and switch incidents (controller/fabric_loop.py)


def guard_view(store: Store) -> dict[str, Any]:
    info = dict(store.kv_get(GUARD_INFO_KEY) or {})
    tripped = bool(store.kv_get(GUARD_KEY, False))
    if not info:  # the loop has not run yet (or runs elsewhere and has not written)
        info = {"reason": "", "rule": "", "since": None, "blocked": [], "slurm_data": None}
    # the breaker flag is the truth (an admin reset clears it before the loop rewrites info)
    info["tripped"] = tripped
    if not tripped:
        info.update(rule="", reason="", since=None, blocked=[])
    info["state"] = "tripped" if tripped else ("undecided" if info.get("undecided") else "armed")
    info["rule_description"] = rule_description(info.get("rule"))
    blast = store.kv_get(BLAST_KEY) or {}
    info["blast_radius"] = {
        "caps": blast.get("caps", {}),
        "tripped": blast.get("tripped", []),
    }
    info["switch_incidents"] = blast.get("switch_incidents", [])
    info["topology"] = blast.get("topology")
    return info


def guard_router(store: Store, reader: Callable[[Request], Principal]) -> APIRouter:
    router = APIRouter(prefix="/api/v1")

    @router.get("/guard")
    def get_guard(_: Principal = Depends(reader)) -> dict[str, Any]:
        return guard_view(store)

    return router
