"""The read routes (admin or read token): nodes, findings, jobs, actions."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from babysitter.controller.api.auth import Principal
from babysitter.controller.db.store import Store, now
from babysitter.controller.loop.decide.node.rules import rule_description
from babysitter.controller.loop.decide.node.verdict import node_verdict
from babysitter.controller.loop.heal.rma import archives
from babysitter.controller.loop.read.ledger import Ledger
from babysitter.finding import Finding, Severity

LEDGER_IN_NODE_VIEW = 20
# controller.history_lookback_days at defaults: gpud's XID lookback in `gpud run` (its events
# retention period, 14 days: leptonai/gpud cmd/gpud/run/command.go, pkg/config/default.go)
HISTORY_LOOKBACK_DAYS = 14.0


def history_since(runtime_state: dict[str, Any]) -> datetime:
    """The start of the window a node's history shows by default (controller.history_lookback_
    days): after a week of benign noise, the history is what happened lately, not all of it."""
    days = float(runtime_state.get("history_lookback_days", HISTORY_LOOKBACK_DAYS))
    return now() - timedelta(days=days)


def read_router(
    store: Store, runtime_state: dict[str, Any], reader: Callable[[Request], Principal]
) -> APIRouter:
    router = APIRouter(prefix="/api/v1")

    @router.get("/nodes")
    def list_nodes(_: Principal = Depends(reader)) -> list[dict[str, Any]]:
        return [node_view(n, runtime_state) for n in store.node_rows()]

    @router.get("/nodes/{name}")
    def get_node(name: str, _: Principal = Depends(reader)) -> dict[str, Any]:
        n = store.node(name)
        if n is None:
            raise HTTPException(404, f"unknown node {name}")
        # the node's remediations, newest first (docs/self-healing.md)
        since = history_since(runtime_state)
        ledger = Ledger(store).history(name, LEDGER_IN_NODE_VIEW, since=since)
        history = [r.to_json() for r in ledger]
        # its RMA evidence archives, newest first (controller/loop/heal/rma.py; url: this API)
        evidence = [a.to_json() for a in archives(store, node=name, limit=10)]
        return {**node_view(n, runtime_state), "ledger": history, "rma_archives": evidence}

    @router.get("/findings")
    def list_findings(
        node: str | None = None,
        since: datetime | None = None,
        severity: Severity | None = None,
        limit: int = Query(1000, ge=1, le=10_000),
        _: Principal = Depends(reader),
    ) -> list[dict[str, Any]]:
        # no since=: the lookback window; an explicit one reaches back as far as retention
        start = history_since(runtime_state) if since is None else since
        return store.findings(node=node, since=start, severity=severity, limit=limit)

    @router.get("/jobs")
    def list_jobs(_: Principal = Depends(reader)) -> list[dict[str, Any]]:
        return [dict(j) for j in store.jobs()]

    @router.get("/actions")
    def list_actions(
        status: str | None = None, _: Principal = Depends(reader)
    ) -> list[dict[str, Any]]:
        # every action says which rule caused it and what that rule means (policy.Rule)
        return [
            {**a.to_json(), "rule_description": rule_description(a.rule)}
            for a in store.actions(status=status)
        ]

    return router


def node_view(n: dict[str, Any], runtime_state: dict[str, Any]) -> dict[str, Any]:
    """What the API shows for a node. The verdict is the policy's own function on the node's
    stored findings and heartbeat (the answer the remediation loop acts on); a validation job
    the loop is running shows as `validating`."""
    timeout = float(runtime_state.get("heartbeat_timeout_s", 120))
    last = n.get("last_report_at")
    age = None if last is None else (now() - last).total_seconds()
    open_findings: list[Finding] = n.get("open_findings") or []
    verdict, _ = node_verdict(open_findings, age, timeout)
    if verdict != "unknown" and n.get("verdict") == "validating":
        verdict = "validating"
    return {
        "name": n["name"],
        "verdict": verdict,
        "last_report_at": last,
        "heartbeat_age_s": None if age is None else round(age, 1),
        "open_findings": [f.to_json_dict() for f in open_findings],
        "worst_severity": n.get("worst_severity", Severity.OK),
        "consecutive_clean": n.get("consecutive_clean", 0),
        "babysitter_drained": bool(n.get("babysitter_drained")),
        "drain_reason": n.get("drain_reason"),
        "slurm_state": n.get("slurm_state"),
        "slurm_reason": n.get("slurm_reason"),
    }
