"""`babysitter ledger [NODE]`: the lemon ledger (every rung babysitter climbed, per node and
GPU), and `babysitter ledger clear NODE`: an admin's way back for a lemon (recorded)."""

from __future__ import annotations

from typing import Any

import click

from babysitter.cli.api_client import call, client, token_opt, url_opt
from babysitter.cli.common import State, echo_json, pass_state
from babysitter.cli.tables import echo, show, table


def ledger_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Table cells of ledger rows (also used by `nodes NODE`)."""
    return [
        [
            (r["created_at"] or "")[:19],
            r["node"],
            r["rung"],
            r["state"],
            r["fault_class"],
            r["gpu_uuid"] or "",
            (r["outcome"] or "")[:80],
        ]
        for r in rows
    ]


LEDGER_COLUMNS = ("when", "node", "rung", "state", "fault", "gpu", "outcome")


@click.group("ledger", invoke_without_command=True)
@click.argument("node", required=False)
@url_opt
@token_opt
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def ledger(
    ctx: click.Context, node: str | None, url: str | None, token: str | None, as_json: bool
) -> None:
    """Remediations (reset, reboot, inspect, lemon), newest first; NODE: only that node."""
    if ctx.invoked_subcommand is not None:
        return
    state: State = ctx.ensure_object(State)
    params = {"node": node} if node else {}
    with client(state, url, token) as c:
        rows = call(c, "GET", "/api/v1/ledger", params=params)
    if as_json:
        echo_json(rows)
        return
    show(table(*LEDGER_COLUMNS, rows=ledger_rows(rows)))


@ledger.command("clear")
@click.argument("node")
@click.option("--reason", default="", help="Why (kept in the ledger and the audit log).")
@url_opt
@token_opt
@pass_state
def clear(state: State, node: str, reason: str, url: str | None, token: str | None) -> None:
    """Clear NODE's ledger: its remediations stop counting towards a lemon and babysitter
    manages the node again (resumed once its fault is gone)."""
    with client(state, url, token) as c:
        r = call(c, "POST", f"/api/v1/nodes/{node}/ledger/clear", json={"reason": reason})
    echo(f"ledger of {node} cleared: {r['cleared']} row(s) (action {r['action_id']})")


commands = [ledger]
