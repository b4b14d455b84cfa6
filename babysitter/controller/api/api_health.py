"""Liveness, readiness and Prometheus metrics (no token: probes and scrapers; /metrics takes
one where controller.metrics_token_file is set)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from babysitter import __version__
from babysitter.controller.api.metrics_snapshot import StoreMetrics
from babysitter.controller.db.store import Store


def _age(at: float | None) -> float | None:
    return None if at is None else round(max(0.0, time.time() - at), 1)


def health_router(
    store: Store,
    snapshot: StoreMetrics,
    runtime_state: dict[str, Any],
    metrics_guard: Callable[[Request], None] | None = None,
) -> APIRouter:
    """`metrics_guard`: checks a /metrics request's token (controller.metrics_token_file);
    None: /metrics is open, like the probes."""
    router = APIRouter()

    @router.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @router.get("/readyz")
    def readyz() -> Response:
        ok = store.ping()
        body = {
            "database": "ok" if ok else "unreachable",
            # leader: this controller holds the lock AND runs the remediation loop
            "leader": bool(runtime_state.get("leader", False)),
            "remediation": bool(runtime_state.get("remediation", False)),
            # seconds since the loops last finished a tick without error (None: not yet)
            "loop_progress_age_s": _age(runtime_state.get("loop_progress_at")),
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @router.get("/metrics", dependencies=[Depends(metrics_guard)] if metrics_guard else [])
    def prom() -> Response:
        # the store-derived values come from the last published read (metrics_snapshot.py):
        # no scrape reads node rows
        return Response(
            snapshot.exposition(bool(runtime_state.get("leader"))), media_type=CONTENT_TYPE_LATEST
        )

    return router
