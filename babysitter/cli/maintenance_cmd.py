"""`babysitter maintenance start NODES --until T --reason R`, `... end NODES`, `... list`:
maintenance windows (a Slurm MAINT reservation, an Alertmanager silence where configured, and
no drain or page from babysitter for those nodes until the window ends)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from babysitter.cli.api_client import call, client, token_opt, url_opt
from babysitter.cli.common import State, echo_json, pass_state
from babysitter.cli.tables import echo, show, table
from babysitter.cli.when import TimeParam


@click.group("maintenance")
def maintenance() -> None:
    """Maintenance windows: nodes babysitter leaves alone while an admin works on them."""


def _describe(w: dict[str, Any]) -> str:
    line = (
        f"window {w['id']}: {w['hostlist']} until {w['ends_at']} ({w['reason']}); "
        f"Slurm reservation {w['reservation'] or 'NONE'}, "
        f"Alertmanager silence {w['silence_id'] or 'none'}"
    )
    return line + "".join(f"\n  problem: {n}" for n in w.get("notes") or [])


@maintenance.command("start")
@click.argument("nodes")
@click.option(
    "--until",
    "until",
    type=TimeParam(past=False),
    required=True,
    help="When it ends: ISO time (2026-11-26T05:00Z) or a duration from now (90m, 2h).",
)
@click.option(
    "--reason", required=True, help="Why (shown on the status page and in the audit log)."
)
@url_opt
@token_opt
@click.option("--json", "as_json", is_flag=True)
@pass_state
def start(
    state: State,
    nodes: str,
    until: datetime,
    reason: str,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> int:
    """Open a maintenance window on NODES (a Slurm hostlist, e.g. node[2-3])."""
    with client(state, url, token) as c:
        w = call(
            c,
            "POST",
            "/api/v1/maintenance",
            json={"nodes": nodes, "until": until.isoformat(), "reason": reason},
        )
    if as_json:
        echo_json(w)
    else:
        show(_describe(w))
    # a window without its reservation is not what was asked for: say so in the exit code
    return 1 if w.get("notes") else 0


@maintenance.command("end")
@click.argument("nodes")
@url_opt
@token_opt
@pass_state
def end(state: State, nodes: str, url: str | None, token: str | None) -> None:
    """End maintenance for NODES now (babysitter watches them again): each window covering
    them lets go of those nodes only, and ends when it has none left."""
    with client(state, url, token) as c:
        changed = call(c, "POST", "/api/v1/maintenance/end", json={"nodes": nodes})
    for w in changed:
        if w["state"] == "ended":
            echo(f"window {w['id']} ({w['hostlist']}) ended")
        else:
            left = len(w["nodes"])
            echo(f"{nodes} left window {w['id']} ({w['hostlist']}): {left} node(s) still in it")


@maintenance.command("list")
@click.option("--all", "show_all", is_flag=True, help="Ended windows too.")
@url_opt
@token_opt
@click.option("--json", "as_json", is_flag=True)
@pass_state
def list_windows(
    state: State, show_all: bool, url: str | None, token: str | None, as_json: bool
) -> None:
    """Open maintenance windows."""
    with client(state, url, token) as c:
        rows = call(c, "GET", "/api/v1/maintenance", params={"all": show_all})
    if as_json:
        echo_json(rows)
        return
    show(
        table(
            "id",
            "nodes",
            "state",
            "until",
            "reason",
            "by",
            "reservation",
            "silence",
            rows=[
                [
                    w["id"],
                    w["hostlist"],
                    w["state"],
                    w["ends_at"],
                    w["reason"],
                    w["created_by"],
                    w["reservation"] or "",
                    w["silence_id"] or "",
                ]
                for w in rows
            ],
        )
    )


commands = [maintenance]
