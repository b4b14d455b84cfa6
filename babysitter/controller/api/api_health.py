"""Liveness, readiness and Prometheus metrics (no token: probes and scrapers)."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from babysitter import __version__
from babysitter.controller.api import cockpit_metrics
from babysitter.controller.api.api_read import node_view
from babysitter.controller.db.store import Store, now
from babysitter.controller.loop.metrics import ControllerMetrics

log = logging.getLogger(__name__)


def _age(at: float | None) -> float | None:
    return None if at is None else round(max(0.0, time.time() - at), 1)


def health_router(
    store: Store, metrics: ControllerMetrics, runtime_state: dict[str, Any]
) -> APIRouter:
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

    @router.get("/metrics")
    def prom() -> Response:
        metrics.is_leader.set(1 if runtime_state.get("leader") else 0)
        try:
            verdicts: dict[str, int] = {"healthy": 0, "suspect": 0, "unhealthy": 0, "unknown": 0}
            # leaf switch of a node, where Slurm has a topology (the leader's snapshot)
            leaf_of = runtime_state.get("leaf_of") or (lambda name: None)
            per_switch: dict[tuple[str, str], int] = {}
            for n in store.node_rows():
                v = node_view(n, runtime_state)["verdict"]
                verdicts[v] = verdicts.get(v, 0) + 1
                leaf = leaf_of(n["name"])
                if leaf:
                    per_switch[(leaf, v)] = per_switch.get((leaf, v), 0) + 1
            cockpit_metrics.refresh(store, metrics, runtime_state, now())
        except Exception:
            # a healthy zero ("0 unhealthy nodes") must never stand in for "cannot tell":
            # publish the failure and withdraw every count read from the store
            log.exception("/metrics: the database cannot be read")
            metrics.store_up.set(0)
            metrics.store_errors.inc()
            metrics.forget_store_values()
        else:
            metrics.store_up.set(1)
            for v, c in verdicts.items():
                metrics.nodes.labels(v).set(c)
            metrics.switch_nodes.clear()  # switches and verdicts that are gone leave no series
            for (leaf, v), c in per_switch.items():
                metrics.switch_nodes.labels(leaf, v).set(c)
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
